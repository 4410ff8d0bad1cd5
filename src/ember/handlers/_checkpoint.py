"""`Checkpoint`: save what a run needs to resume, on any event, with combined retention."""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import jax
import numpy as np

from ember.checkpoint import CheckpointInfo, CheckpointStore, check_retention
from ember.engine import Engine, Events, EventsList, FilteredEvent, RemovableEventHandle
from ember.handlers._loading import kind_of, load_objects
from ember.handlers._renamed import renamed
from ember.handlers._savers import DiskSaver, as_store


class _Unset:
    """The default of a deprecated argument whose ``None`` means something."""


_UNSET = _Unset()


class Checkpoint:
    """Saves ``to_save`` into a ``CheckpointStore`` when its event fires, Ignite's way.

    Ignite's arguments: ``Checkpoint(to_save, save_handler, filename_prefix, score_function, score_name,
    n_saved, global_step_transform)``. Objects with ``state_dict()``/``load_state_dict()`` (engines,
    handlers) go into the manifest; objects with ``tree_state_dict()``/``load_tree_state_dict()`` (a
    trainer: its train state) go into the array file; a trainer contributes both. Writes run in the
    background (the host copy is made before the handler returns); an error in a background write is
    raised at the next iteration and at COMPLETED, which also waits until everything is on disk. After
    each save the ``n_saved`` best by ``score_function`` (``mode``) are kept, or without a score the
    ``n_saved`` newest, and with ``keep_every`` also every step that is a multiple of it. Each checkpoint
    is a folder named by the step (``step_00000400``) and, when scored, the score
    (``step_00000400-val_accuracy=0.9731``).

    Args:
        to_save: what to save, by name.
        save_handler: where: a folder, a [`CheckpointStore`][ember.checkpoint.CheckpointStore], or a
            [`DiskSaver`][ember.handlers.DiskSaver].
        filename_prefix: starts every checkpoint's name, with ``_`` after it (``mnist_step_00000400``);
            retention only touches names with it.
        score_function: ``score_function(engine) -> float``, e.g. an evaluator's validation accuracy.
        score_name: the score's name in checkpoint names and manifests (default ``"score"``).
        n_saved: checkpoints kept: the best by ``score_function``, else the newest; ``None`` keeps all.
        global_step_transform: ``global_step_transform(engine, event_name) -> int``, the step that names a checkpoint
            (Ignite's signature; [`global_step_from_engine`][ember.handlers.global_step_from_engine] for a handler on an
            evaluator); the engine's iteration by default.
        mode: ``"max"`` or ``"min"``: which scores are best.
        keep_every: also keep checkpoints whose step is a multiple of this.
        background: write on a background thread (default) or before returning.
        on_error: what a failed write (disk full, permission denied: an ``OSError``) does: ``"raise"``
            (default) fails the run with it; ``"warn"`` issues a ``RuntimeWarning`` naming the error and
            training goes on. Either way the failed checkpoint leaves nothing behind and earlier ones
            stay intact.
        store: deprecated name of ``save_handler``.
        keep_latest: deprecated: the newest kept (with ``keep_best``, beside the best); use ``n_saved``,
            and a second handler for the newest beside the best.
        keep_best: deprecated: the best kept; use ``n_saved`` with ``score_function``.
        score_fn: deprecated name of ``score_function``.
        step_fn: deprecated ``step_fn(engine)``; use ``global_step_transform(engine, event_name)``.
        prefix: deprecated name of ``filename_prefix``.

    Examples:
        >>> import tempfile
        >>> from ember import Engine, Events
        >>> from ember.handlers import Checkpoint
        >>> trainer = Engine(lambda e, b: b)
        >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp(), n_saved=2)
        >>> _ = saver.attach(trainer, Events.EPOCH_COMPLETED)
        >>> _ = trainer.run([1, 2], max_epochs=3)
        >>> [c.path.name for c in saver.store.checkpoints()]
        ['step_00000004', 'step_00000006']
    """

    def __init__(
        self,
        to_save: Mapping[str, Any],
        save_handler: CheckpointStore | DiskSaver | str | os.PathLike[str] | None = None,
        filename_prefix: str = "",
        score_function: Callable[[Engine], float] | None = None,
        score_name: str | None = None,
        n_saved: int | None = 1,
        global_step_transform: Callable[[Engine, Any], int] | None = None,
        *,
        mode: Literal["min", "max"] = "max",
        keep_every: int | None = None,
        background: bool = True,
        on_error: Literal["raise", "warn"] = "raise",
        store: CheckpointStore | str | os.PathLike[str] | None = None,
        keep_latest: int | _Unset | None = _UNSET,
        keep_best: int | None = None,
        score_fn: Callable[[Engine], float] | None = None,
        step_fn: Callable[[Engine], int] | None = None,
        prefix: str | None = None,
    ) -> None:
        save_handler = renamed("Checkpoint", "store", store, "save_handler", save_handler)
        score_function = renamed("Checkpoint", "score_fn", score_fn, "score_function", score_function)
        filename_prefix = renamed("Checkpoint", "prefix", prefix, "filename_prefix", filename_prefix)
        if step_fn is not None:
            old = renamed("Checkpoint", "step_fn", step_fn, "global_step_transform", global_step_transform)
            global_step_transform = lambda engine, _event: old(engine)  # noqa: E731
        if not isinstance(to_save, Mapping) or not to_save:
            raise TypeError(f"`to_save` must be a non-empty mapping of names to objects, got {to_save!r}.")
        if save_handler is None:
            raise TypeError("`save_handler` is required: a folder, a CheckpointStore or a DiskSaver.")
        if score_function is not None and not callable(score_function):
            raise TypeError(f"`score_function` must be callable as score_function(engine), got {score_function!r}.")
        if global_step_transform is not None and not callable(global_step_transform):
            raise TypeError(
                "`global_step_transform` must be callable as global_step_transform(engine, event_name), "
                f"got {global_step_transform!r}."
            )
        if not isinstance(keep_latest, _Unset) or keep_best is not None:
            warnings.warn(
                "Checkpoint(keep_latest=..., keep_best=...) is deprecated: use n_saved= (the best by "
                "score_function, else the newest), Ignite's name, and a second Checkpoint for the newest beside "
                "the best; keep_latest and keep_best go in the next release.",
                DeprecationWarning,
                stacklevel=2,
            )
            latest = 1 if isinstance(keep_latest, _Unset) else keep_latest
            best = keep_best
        else:
            if n_saved is not None and (not isinstance(n_saved, int) or isinstance(n_saved, bool) or n_saved < 1):
                raise ValueError(f"`n_saved` must be a positive int or None (keep every checkpoint), got {n_saved!r}.")
            latest, best = (n_saved, None) if score_function is None else (None, n_saved)
        self._kinds = {name: kind_of(name, obj) for name, obj in to_save.items()}
        check_retention(latest, best, keep_every, mode)
        if best is not None and score_function is None:
            raise ValueError("`keep_best` needs `score_function`, the score to rank checkpoints by.")
        if on_error not in ("raise", "warn"):
            raise ValueError(f'`on_error` must be "raise" or "warn", got {on_error!r}.')
        self.on_error = on_error
        self.to_save = dict(to_save)
        self.store = as_store(save_handler)
        self.n_saved, self.keep_every = n_saved, keep_every
        self._keep_latest, self._keep_best = latest, best
        self.score_function = score_function
        self.mode: Literal["min", "max"] = mode
        self.score_name = score_name or ("score" if score_function is not None else None)
        self.global_step_transform = global_step_transform
        self.filename_prefix = filename_prefix
        self._prefix = f"{filename_prefix}_" if filename_prefix else ""  # Ignite's separator: mnist_step_...
        self.background = background
        self.last_checkpoint: CheckpointInfo | None = None
        self._saved: _Saved | None = None  # the checkpoint written (or resumed from) last, and what it holds

    def __call__(self, engine: Engine) -> None:
        """Save now, then apply the retention policies once the checkpoint is on disk.

        One step is written once. Fired again at the same step (``ITERATION_COMPLETED(every=N) | COMPLETED`` on a
        run that ends on a multiple of N, or the EPOCH_COMPLETED a resumed run still owed), it rewrites only that
        checkpoint's manifest when its arrays are the very ones saved (or restored) there and its score is the same;
        when the arrays have changed (a handler lowered the learning rate in between), the new checkpoint replaces
        that one. A scored save with another score is another candidate for the best, kept beside it.
        """
        outer = engine.outer_engine  # an evaluator's run inside a trainer's: the trainer's run ends the writing
        for watched in (engine,) if outer is None else (engine, outer):
            if not watched.has_event_handler(self._finish, Events.COMPLETED):  # add_event_handler, Ignite's way
                self._watch(watched)
        transform = self.global_step_transform
        step = int(transform(engine, engine.last_event_name)) if transform is not None else engine.state.iteration
        metrics: dict[str, float] = {}
        name = f"{self._prefix}step_{step:08d}"
        if self.score_function is not None and self.score_name is not None:
            score = _score(self.score_function(engine))
            metrics[self.score_name] = score
            name += f"-{self.score_name}={score:.4f}"
        states = {k: obj.state_dict() for k, obj in self.to_save.items() if callable(getattr(obj, "state_dict", None))}
        trees = {k: obj.tree_state_dict() for k, obj in self.to_save.items() if self._kinds[k] == "tree"}
        saved = self._saved if self._saved is not None and self._saved.step == step else None
        if saved is not None and saved.metrics == metrics and saved.holds(trees):
            if saved.states != states:
                self._amend(saved, states)
            return
        replaces = saved.name if saved is not None and not metrics else None  # a new score is a new best candidate
        if self.store.writing:
            self._wait()  # the previous save is on disk, older ones pruned: names are settled
        if replaces is None and self._is_checkpoint(name):
            replaces = name  # a checkpoint of this step from before (a relaunch): this one takes its place
        metadata = {"state_dicts": states}
        with self._failures():
            if self.background:
                self.store.save_in_background(
                    trees, step=step, metrics=metrics, metadata=metadata, name=name, then=self._prune, replaces=replaces
                )
            else:
                self.last_checkpoint = self.store.save(
                    trees, step=step, metrics=metrics, metadata=metadata, name=name, replaces=replaces
                )
        self._saved = _Saved.of(step, name, trees, states, metrics)
        if not self.background:
            self._prune()
        elif engine.last_event_name is Events.COMPLETED and outer is None:
            self._wait()  # the run ends here; a watcher added just now would not run in this firing

    def _amend(self, saved: _Saved, states: dict[str, Any]) -> None:
        """Write the new state dicts into the manifest of the checkpoint ``saved`` describes; its arrays stay."""
        with self._failures():
            if self.background:
                self.store.amend_in_background(saved.name, metadata={"state_dicts": states})
            else:
                self.last_checkpoint = self.store.amend(saved.name, metadata={"state_dicts": states})
        saved.states = states

    def _is_checkpoint(self, name: str) -> bool:
        """Whether a valid checkpoint is named ``name`` (a damaged one the store moves aside as it writes)."""
        if not (self.store.root / name).exists():
            return False
        try:
            self.store.verify(self.store.root / name)
        except ValueError:  # CorruptCheckpointError too
            return False
        return True

    @contextlib.contextmanager
    def _failures(self) -> Generator[None]:
        """Let a failed write raise, or with ``on_error="warn"`` turn it into a warning."""
        try:
            yield
        except OSError as e:
            if self.on_error == "raise":
                raise
            warnings.warn(
                f"A checkpoint could not be written ({type(e).__name__}: {e}); training goes on, and the "
                "earlier checkpoints are intact.",
                RuntimeWarning,
                stacklevel=2,
            )

    @staticmethod
    def load_objects(
        to_load: Mapping[str, Any], checkpoint: CheckpointInfo | CheckpointStore | str | os.PathLike[str]
    ) -> CheckpointInfo:
        """Ignite's ``Checkpoint.load_objects``: ``load_objects`` (a checkpoint's folder, or a folder: its latest).

        Examples:
            >>> import tempfile
            >>> from ember import Engine
            >>> from ember.handlers import Checkpoint
            >>> trainer, folder = Engine(lambda e, b: b), tempfile.mkdtemp()
            >>> _ = trainer.run([1, 2]); _ = Checkpoint({"trainer": trainer}, folder).save_now(trainer)
            >>> Checkpoint.load_objects({"trainer": Engine(lambda e, b: b)}, folder + "/step_00000002").step
            2
        """
        return load_objects(to_load, checkpoint)

    def save_now(self, engine: Engine) -> CheckpointInfo:
        """Save and wait until the checkpoint is on disk (retention applied); return it.

        Examples:
            >>> import tempfile
            >>> from ember import Engine
            >>> from ember.handlers import Checkpoint
            >>> trainer = Engine(lambda e, b: b)
            >>> _ = trainer.run([1, 2])
            >>> Checkpoint({"trainer": trainer}, tempfile.mkdtemp()).save_now(trainer).step
            2
        """
        self(engine)
        self._wait()
        if self.last_checkpoint is None:
            raise RuntimeError(f"No checkpoint could be written to {self.store.root}.")
        return self.last_checkpoint

    def resume(self, reader: Any = None) -> CheckpointInfo | None:
        """Restore everything in ``to_save`` from the latest valid checkpoint; ``None`` if there is none.

        One call resumes a run exactly: the trainer's train state and counters, the data position, and every stateful
        handler in ``to_save``. ``reader`` picks another checkpoint
        ([`HighestCheckpointReader`][ember.handlers.HighestCheckpointReader], ...); it reads this handler's store by
        default.

        Examples:
            >>> import tempfile
            >>> from ember import Engine
            >>> from ember.handlers import Checkpoint
            >>> folder = tempfile.mkdtemp()
            >>> trainer = Engine(lambda e, b: b)
            >>> print(Checkpoint({"trainer": trainer}, folder).resume())  # first run: from scratch
            None
            >>> _ = trainer.run([1, 2, 3]); _ = Checkpoint({"trainer": trainer}, folder).save_now(trainer)
            >>> again = Engine(lambda e, b: b)
            >>> Checkpoint({"trainer": again}, folder).resume().step, again.state.iteration
            (3, 3)
        """
        from ember.handlers._readers import CheckpointReader

        reader = reader if reader is not None else CheckpointReader(self.store)
        if not isinstance(reader, CheckpointReader):
            raise TypeError(f"`reader` must be a CheckpointReader, got {type(reader).__name__}.")
        info = reader.load(self.to_save)
        if info is not None and info.path.parent == self.store.root:  # saving this step again amends it
            trees = {k: obj.tree_state_dict() for k, obj in self.to_save.items() if self._kinds[k] == "tree"}
            states = info.manifest.get("metadata", {}).get("state_dicts", {})
            self._saved = _Saved.of(info.step, info.path.name, trees, states, dict(info.metrics))
        return info

    def latest_committed(self) -> CheckpointInfo | None:
        """The newest checkpoint of this handler (named with its ``filename_prefix``) committed on disk, or ``None``.

        Read from the store's folder: a background save counts once its write is finished, whichever run wrote it.
        Damaged checkpoints are left out (without the warning a restore gives).

        Examples:
            >>> import tempfile
            >>> from ember import Engine
            >>> from ember.handlers import Checkpoint
            >>> trainer = Engine(lambda e, b: b)
            >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp())
            >>> print(saver.latest_committed())
            None
            >>> _ = trainer.run([1, 2]); _ = saver.save_now(trainer)
            >>> saver.latest_committed().step
            2
        """
        mine = [c for c in self.store.checkpoints() if c.path.name.startswith(self._prefix)]
        return mine[-1] if mine else None

    def _wait(self) -> None:
        """Wait for a background save (and its retention) to finish; it is then the last checkpoint."""
        with self._failures():
            self.last_checkpoint = self.store.wait() or self.last_checkpoint

    def _prune(self) -> None:
        """Apply the retention policies: after a foreground save, or on the writer thread after a background one."""
        self.store.prune(
            keep_latest=self._keep_latest,
            keep_best=self._keep_best,
            metric=self.score_name,
            mode=self.mode,
            keep_every=self.keep_every,
            prefix=self._prefix,
        )

    def _check(self) -> None:  # every iteration: no context manager unless a write is in flight
        if self.store.writing:
            with self._failures():
                self.store.raise_if_failed()

    def _finish(self, engine: Engine) -> None:
        if self.background and engine.outer_engine is None:
            self._wait()

    def attach(
        self, engine: Engine, event: Events | FilteredEvent | EventsList = Events.EPOCH_COMPLETED
    ) -> RemovableEventHandle:
        """Save on ``event``; surface background errors each iteration; finish writing at COMPLETED.

        With background writes, retention runs on the writer thread once each save is committed, so a
        checkpoint is only deleted after its successor is safely on disk and the training thread waits for
        neither; COMPLETED waits for the last save. Attached to an evaluator's COMPLETED, each save is
        finished before the evaluator's run returns, unless that run was started from another engine's
        handler (``Evaluate`` on a trainer): then the trainer goes on while the save is written, its iterations
        surface a failed write, and its COMPLETED waits for the last one.

        Examples:
            >>> import tempfile
            >>> from ember import Engine, Events
            >>> from ember.handlers import Checkpoint
            >>> trainer = Engine(lambda e, b: b)
            >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp())
            >>> _ = saver.attach(trainer, Events.ITERATION_COMPLETED(every=2))
        """
        handle = engine.add_event_handler(event, self)
        self._watch(engine)
        return handle

    def _watch(self, engine: Engine) -> None:
        """Surface background errors each iteration; finish writing at COMPLETED (after a save there)."""
        engine.add_event_handler(Events.ITERATION_COMPLETED, self._check)
        engine.add_event_handler(Events.COMPLETED, self._finish)


def _score(value: Any) -> float:
    """A ``score_function``'s result as a float, or a ``TypeError`` saying what it returned."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float | np.number | np.ndarray | jax.Array)
        or (np.ndim(value) != 0)
    ):
        raise TypeError(
            f"`score_function` must return a number (a float, or a 0-d array), got {value!r} of type "
            f"{type(value).__name__}."
        )
    return float(value)


@dataclass
class _Saved:
    """A checkpoint a `Checkpoint` wrote (or resumed from): its step, name, states, metrics, and its arrays.

    The arrays are held by weak reference (or, for Python scalars, by value): a train state is replaced, never
    changed in place, so the same objects mean the same values, and nothing is kept alive for the comparison.
    """

    step: int
    name: str
    leaves: list[tuple[str, Any]]
    states: dict[str, Any]
    metrics: dict[str, float]

    @classmethod
    def of(
        cls, step: int, name: str, trees: dict[str, Any], states: dict[str, Any], metrics: dict[str, float]
    ) -> _Saved:
        return cls(step, name, _references(trees), states, metrics)

    def holds(self, trees: dict[str, Any]) -> bool:
        """Whether ``trees`` are the very arrays this checkpoint holds."""
        now = _flat(trees)
        if [path for path, _ in now] != [path for path, _ in self.leaves]:
            return False
        for (_, ref), (_, leaf) in zip(self.leaves, now, strict=True):
            if isinstance(ref, weakref.ref):
                if ref() is not leaf:
                    return False
            elif type(ref) is not type(leaf) or ref != leaf:
                return False
        return True


def _flat(trees: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(f"{name}/{path}", leaf) for name, tree in sorted(trees.items()) for path, leaf in sorted(tree.items())]


def _references(trees: dict[str, Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for path, leaf in _flat(trees):
        try:
            out.append((path, weakref.ref(leaf)))
        except TypeError:  # an int, a float, None: compared by value
            out.append((path, leaf))
    return out
