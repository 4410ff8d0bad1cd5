"""`Checkpoint`: save what a run needs to resume, on any event, with combined retention."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Generator, Mapping
from typing import Any, Literal

from ember.checkpoint import CheckpointInfo, CheckpointStore, CorruptCheckpointError, check_retention, open_store
from ember.engine import Engine, Events, EventsList, FilteredEvent, RemovableEventHandle


def _kind(name: str, obj: Any) -> str:
    if callable(getattr(obj, "tree_state_dict", None)):
        return "tree"  # contributes arrays (a training engine's train state), and maybe a state dict too
    if callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
        return "state"
    raise TypeError(
        f"`to_save[{name!r}]` must have state_dict()/load_state_dict() (an engine, a handler, a dataset) or "
        f"tree_state_dict()/load_tree_state_dict() (a trainer); got {type(obj).__name__}."
    )


def global_step_from_engine(engine: Engine) -> Callable[[Engine], int]:
    """A ``step_fn`` that names checkpoints by ``engine``'s iteration, for a handler on another engine.

    Examples:
        >>> from ember import Engine
        >>> from ember.handlers import global_step_from_engine
        >>> trainer, evaluator = Engine(lambda e, b: b), Engine(lambda e, b: b)
        >>> _ = trainer.run([1, 2, 3])
        >>> global_step_from_engine(trainer)(evaluator)
        3
    """
    return lambda _: engine.state.iteration


class Checkpoint:
    """Saves ``to_save`` into a :class:`~ember.checkpoint.CheckpointStore` when its event fires.

    Objects with ``state_dict()``/``load_state_dict()`` (engines, handlers, datasets) go into the manifest;
    objects with ``tree_state_dict()``/``load_tree_state_dict()`` (a trainer: its train state) go into the
    array file; a trainer contributes both. Writes run in the background (the host copy is made before
    the handler returns); an error in a background write is raised at the next iteration and at
    COMPLETED, which also waits until everything is on disk. After each save the retention policies run:
    keep the ``keep_latest`` newest, the ``keep_best`` best by ``score_fn`` (``mode``), and every
    ``keep_every``-th step, together. File names carry the step and, when scored, the score.

    Args:
        to_save: what to save, by name.
        store: a :class:`CheckpointStore` or a folder.
        keep_latest: newest checkpoints kept (``None``: all).
        keep_best: best checkpoints kept by ``score_fn``.
        score_fn: ``score_fn(engine) -> float``, e.g. an evaluator's validation accuracy.
        score_name: the score's name in file names and manifests (default ``"score"``).
        mode: ``"max"`` or ``"min"``: which scores are best.
        keep_every: also keep checkpoints whose step is a multiple of this.
        step_fn: ``step_fn(engine) -> int``; the engine's iteration by default
            (:func:`global_step_from_engine` for a handler on an evaluator).
        prefix: starts every file name; retention only touches names with it.
        background: write on a background thread (default) or before returning.
        on_error: what a failed write (disk full, permission denied: an ``OSError``) does: ``"raise"``
            (default) fails the run with it; ``"warn"`` issues a ``RuntimeWarning`` naming the error and
            training goes on. Either way the failed checkpoint leaves nothing behind and earlier ones
            stay intact.

    Examples:
        >>> import tempfile
        >>> from ember import Engine, Events
        >>> from ember.handlers import Checkpoint
        >>> trainer = Engine(lambda e, b: b)
        >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp(), keep_latest=2)
        >>> _ = saver.attach(trainer, Events.EPOCH_COMPLETED)
        >>> _ = trainer.run([1, 2], max_epochs=3)
        >>> [c.path.name for c in saver.store.checkpoints()]
        ['step_00000004', 'step_00000006']
    """

    def __init__(
        self,
        to_save: Mapping[str, Any],
        store: CheckpointStore | str | os.PathLike[str],
        *,
        keep_latest: int | None = 1,
        keep_best: int | None = None,
        score_fn: Callable[[Engine], float] | None = None,
        score_name: str | None = None,
        mode: Literal["min", "max"] = "max",
        keep_every: int | None = None,
        step_fn: Callable[[Engine], int] | None = None,
        prefix: str = "",
        background: bool = True,
        on_error: Literal["raise", "warn"] = "raise",
    ) -> None:
        if not isinstance(to_save, Mapping) or not to_save:
            raise TypeError(f"`to_save` must be a non-empty mapping of names to objects, got {to_save!r}.")
        self._kinds = {name: _kind(name, obj) for name, obj in to_save.items()}
        check_retention(keep_latest, keep_best, keep_every, mode)
        if keep_best is not None and score_fn is None:
            raise ValueError("`keep_best` needs `score_fn`, the score to rank checkpoints by.")
        if score_fn is not None and not callable(score_fn):
            raise TypeError(f"`score_fn` must be callable as score_fn(engine), got {score_fn!r}.")
        if on_error not in ("raise", "warn"):
            raise ValueError(f'`on_error` must be "raise" or "warn", got {on_error!r}.')
        self.on_error = on_error
        self.to_save = dict(to_save)
        self.store = store if isinstance(store, CheckpointStore) else CheckpointStore(store)
        self.keep_latest, self.keep_best, self.keep_every = keep_latest, keep_best, keep_every
        self.score_fn = score_fn
        self.mode: Literal["min", "max"] = mode
        self.score_name = score_name or ("score" if score_fn is not None else None)
        self.step_fn = step_fn or (lambda engine: engine.state.iteration)
        self.prefix = prefix
        self.background = background
        self.last_checkpoint: CheckpointInfo | None = None
        self._last: tuple[str, dict[str, Any]] | None = None  # the name and state dicts saved last

    def __call__(self, engine: Engine) -> None:
        """Save now, then apply the retention policies once the checkpoint is on disk."""
        step = int(self.step_fn(engine))
        metrics: dict[str, float] = {}
        name = f"{self.prefix}step_{step:08d}"
        if self.score_fn is not None and self.score_name is not None:
            score = float(self.score_fn(engine))
            metrics[self.score_name] = score
            name += f"-{self.score_name}={score:.4f}"
        states = {k: obj.state_dict() for k, obj in self.to_save.items() if callable(getattr(obj, "state_dict", None))}
        if (name, states) == self._last:
            return  # fired twice at one step with nothing changed (EPOCH_COMPLETED | COMPLETED): saved already
        self._last = (name, states)
        if self.store.writing:
            self._wait()  # the previous save is on disk, older ones pruned: names are settled
        name = self._unused(name)
        trees = {k: obj.tree_state_dict() for k, obj in self.to_save.items() if self._kinds[k] == "tree"}
        with self._failures():
            if self.background:
                self.store.save_in_background(
                    trees, step=step, metrics=metrics, metadata={"state_dicts": states}, name=name, then=self._prune
                )
            else:
                self.last_checkpoint = self.store.save(
                    trees, step=step, metrics=metrics, metadata={"state_dicts": states}, name=name
                )
        if not self.background:
            self._prune()

    def _unused(self, name: str) -> str:
        """``name``, or ``name.2``, ``name.3`` ... where a valid checkpoint holds it already.

        A resumed run saves a step it saved before when it fires an event the interrupted run did not
        reach (the EPOCH_COMPLETED owed by a checkpoint of an epoch's last iteration); the newer save
        is the one to resume from next, and retention treats both as checkpoints of that step.
        """
        root, candidate, n = self.store.root, name, 1
        while (root / candidate).exists():
            try:
                self.store.verify(root / candidate)
            except CorruptCheckpointError:
                return candidate  # the store moves the damaged one aside as it writes
            except ValueError:
                pass
            n += 1
            candidate = f"{name}.{n}"
        return candidate

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

        One call resumes a run exactly: the trainer's train state and counters, the data position, and
        every stateful handler in ``to_save``. ``reader`` picks another checkpoint
        (:class:`HighestCheckpointReader`, ...); it reads this handler's store by default.

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
        return reader.load(self.to_save)

    def _wait(self) -> None:
        """Wait for a background save (and its retention) to finish; it is then the last checkpoint."""
        with self._failures():
            self.last_checkpoint = self.store.wait() or self.last_checkpoint

    def _prune(self) -> None:
        """Apply the retention policies: after a foreground save, or on the writer thread after a background one."""
        self.store.prune(
            keep_latest=self.keep_latest,
            keep_best=self.keep_best,
            metric=self.score_name,
            mode=self.mode,
            keep_every=self.keep_every,
            prefix=self.prefix,
        )

    def _check(self) -> None:  # every iteration: no context manager unless a write is in flight
        if self.store.writing:
            with self._failures():
                self.store.raise_if_failed()

    def _finish(self) -> None:
        if self.background:
            self._wait()

    def attach(
        self, engine: Engine, event: Events | FilteredEvent | EventsList = Events.EPOCH_COMPLETED
    ) -> RemovableEventHandle:
        """Save on ``event``; surface background errors each iteration; finish writing at COMPLETED.

        With background writes, retention runs on the writer thread once each save is committed, so a
        checkpoint is only deleted after its successor is safely on disk and the training thread waits for
        neither; COMPLETED waits for the last save. Attached to an evaluator's COMPLETED, each save is
        therefore finished before the evaluator's run returns.

        Examples:
            >>> import tempfile
            >>> from ember import Engine, Events
            >>> from ember.handlers import Checkpoint
            >>> trainer = Engine(lambda e, b: b)
            >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp())
            >>> _ = saver.attach(trainer, Events.ITERATION_COMPLETED(every=2))
        """
        handle = engine.add_event_handler(event, self)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self._check)
        engine.add_event_handler(Events.COMPLETED, self._finish)  # after a save on COMPLETED itself
        return handle


def load_objects(
    to_load: Mapping[str, Any],
    checkpoint: CheckpointInfo | CheckpointStore | str | os.PathLike[str],
    *,
    store: CheckpointStore | None = None,
) -> CheckpointInfo:
    """Restore ``to_load`` in place from a checkpoint (a store or folder: its latest valid checkpoint).

    Array trees are checked against the objects' current structure before anything is changed. A folder
    of orbax-written checkpoints is read through :class:`~ember.checkpoint.OrbaxStore`; ``store`` names the
    store a :class:`~ember.checkpoint.CheckpointInfo` came from.

    Examples:
        >>> import tempfile
        >>> from ember import Engine
        >>> from ember.handlers import Checkpoint, load_objects
        >>> trainer = Engine(lambda e, b: b)
        >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp(), background=False)
        >>> _ = trainer.run([1, 2, 3]); saver(trainer)
        >>> fresh = Engine(lambda e, b: b)
        >>> load_objects({"trainer": fresh}, saver.store).step, fresh.state.iteration
        (3, 3)
    """
    kinds = {name: _kind(name, obj) for name, obj in to_load.items()}
    if isinstance(checkpoint, CheckpointInfo):
        store, info = store or open_store(checkpoint.path.parent), checkpoint
    else:
        store = checkpoint if isinstance(checkpoint, CheckpointStore) else open_store(checkpoint)
        info = store.latest()
        if info is None:
            raise FileNotFoundError(f"No valid checkpoint in {store.root} to load from.")
    targets = {name: obj.tree_state_dict() for name, obj in to_load.items() if kinds[name] == "tree"}
    trees, info = store.restore(target=targets or None, checkpoint=info)
    states = info.manifest.get("metadata", {}).get("state_dicts", {})
    missing = [
        name for name, obj in to_load.items() if callable(getattr(obj, "load_state_dict", None)) and name not in states
    ]
    if missing:
        raise KeyError(f"The checkpoint {info.path.name!r} holds no state for {missing}; it holds {sorted(states)}.")
    for name, obj in to_load.items():
        if callable(getattr(obj, "load_state_dict", None)):
            obj.load_state_dict(states[name])
        if kinds[name] == "tree":
            obj.load_tree_state_dict(trees[name])
    return info
