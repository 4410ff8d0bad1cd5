"""`Checkpoint`: save what a run needs to resume, on any event, keeping Ignite's ``n_saved`` best or newest."""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Generator, Mapping, MutableMapping, Sequence
from typing import Any, Literal

import jax

from ember.checkpoint import CheckpointInfo, check_retention
from ember.checkpoint._stores import Store
from ember.engine import Engine, Events, EventsList, FilteredEvent, RemovableEventHandle, Stateful, collect_handles
from ember.handlers._checkpoint_files import CheckpointFiles
from ember.handlers._checkpoint_record import CheckpointRecord
from ember.handlers._loading import kind_of, load_objects
from ember.handlers._retention import Item, Ledger
from ember.handlers._same_arrays import Saved, score_of
from ember.handlers._save_handlers import (
    SaveHandler,
    takes_metadata,
)
from ember.handlers._savers import DiskSaver


class Checkpoint(CheckpointRecord, CheckpointFiles):
    """Saves ``to_save`` when its event fires, Ignite's way, into one of ember's stores or a save handler of yours.

    Ignite's arguments: ``Checkpoint(to_save, save_handler, filename_prefix, score_function, score_name, n_saved,
    global_step_transform, filename_pattern, include_self, greater_or_equal, save_on_rank)``. Ignite's rule decides
    what is kept: a new checkpoint is saved while fewer than ``n_saved`` are kept, or when its priority (the score,
    else the global step) beats the lowest kept one's (``>``; ``>=`` with ``greater_or_equal``), and the lowest then
    goes; ``keep_every`` also keeps every step that is a multiple of it.

    Into a store (a folder, a [`CheckpointStore`][ember.checkpoint.CheckpointStore] or a
    [`DiskSaver`][ember.handlers.DiskSaver]), each checkpoint is a folder (``mnist_step_00000400-acc=0.9731``, or
    ``filename_pattern``) written atomically and verified. Objects with ``state_dict()``/``load_state_dict()``
    (engines, handlers) go into the manifest; objects with ``tree_state_dict()``/``load_tree_state_dict()`` (a
    trainer: its train state) go into the array file. Writes run in the background (the host copy is made before
    the handler returns); an error in a background write is raised at the next iteration and at COMPLETED, which
    also waits until everything is on disk. A checkpoint that retention no longer keeps is deleted only once its
    successor is on disk.

    A ``save_handler`` that is a function ``(checkpoint, filename, metadata)`` or an object with Ignite's
    ``BaseSaveHandler`` methods ([`SaveHandler`][ember.handlers.SaveHandler]) is called on the training thread,
    as Ignite calls it, with a dict of host values and Ignite's file name (``checkpoint_400.ckpt``); its ``remove``
    is called for a checkpoint no longer kept, after the new one was saved.

    Args:
        to_save: what to save, by name.
        save_handler: where: a folder, a [`CheckpointStore`][ember.checkpoint.CheckpointStore], a
            [`DiskSaver`][ember.handlers.DiskSaver], or your own save handler.
        filename_prefix: starts every checkpoint's name, with ``_`` after it (``mnist_step_00000400``).
        score_function: ``score_function(engine) -> float``, e.g. an evaluator's validation accuracy.
        score_name: the score's name in checkpoint names and manifests; given alone, the score is
            ``engine.state.metrics[score_name]``
            ([`get_default_score_fn`][ember.handlers.Checkpoint.get_default_score_fn]).
        n_saved: checkpoints kept: the best by ``score_function``, else the newest; ``None`` keeps all.
        global_step_transform: ``global_step_transform(engine, event_name) -> int``, the step that names a checkpoint
            (Ignite's signature; [`global_step_from_engine`][ember.handlers.global_step_from_engine] for a handler on an
            evaluator); the engine's iteration by default.
        filename_pattern: names checkpoints from ``{filename_prefix}``, ``{name}``, ``{score}``, ``{score_name}``,
            ``{global_step}`` and ``{ext}`` (``"ckpt"``), as Ignite's; ``None``: ember's folder names in a store,
            Ignite's [`setup_filename_pattern`][ember.handlers.Checkpoint.setup_filename_pattern] for a save handler.
        include_self: save this handler's own ``state_dict()`` (what it keeps) as ``"checkpointer"``.
        greater_or_equal: a checkpoint scoring the same as the lowest kept one replaces it (Ignite's option).
        save_on_rank: the process that calls a save handler of yours (all take part in gathering the arrays).
        mode: ``"max"`` or ``"min"``: which scores are best.
        keep_every: also keep checkpoints whose step is a multiple of this.
        background: write into a store on a background thread (default) or before returning.
        on_error: what a failed write (disk full, permission denied: an ``OSError``) does: ``"raise"``
            (default) fails the run with it; ``"warn"`` issues a ``RuntimeWarning`` naming the error and
            training goes on. Either way the failed checkpoint leaves nothing behind and earlier ones
            stay intact.

    Attributes:
        save_handler: where checkpoints go: the `DiskSaver`, store or handler given (a folder becomes a `DiskSaver`).
        store: the [`CheckpointStore`][ember.checkpoint.CheckpointStore] written to, or ``None`` with your own
            save handler.

    Examples:
        >>> import tempfile
        >>> from ember import Engine, Events
        >>> from ember.handlers import Checkpoint
        >>> trainer = Engine(lambda e, b: b)
        >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp(), n_saved=2)
        >>> _ = saver.attach(trainer, Events.EPOCH_COMPLETED)
        >>> _ = trainer.run([1, 2], max_epochs=3)
        >>> [c.path.name for c in saver.store.checkpoints()], saver.last_checkpoint.name
        (['step_00000004', 'step_00000006'], 'step_00000006')
    """

    Item = Item
    ext = "ckpt"

    def __init__(
        self,
        to_save: Mapping[str, Any],
        save_handler: Store | DiskSaver | SaveHandler | Callable[..., Any] | str | os.PathLike[str] | None = None,
        filename_prefix: str = "",
        score_function: Callable[[Engine], float] | None = None,
        score_name: str | None = None,
        n_saved: int | None = 1,
        global_step_transform: Callable[[Engine, Any], int] | None = None,
        filename_pattern: str | None = None,
        include_self: bool = False,
        greater_or_equal: bool = False,
        save_on_rank: int = 0,
        *,
        mode: Literal["min", "max"] = "max",
        keep_every: int | None = None,
        background: bool = True,
        on_error: Literal["raise", "warn"] = "raise",
    ) -> None:
        if not isinstance(to_save, Mapping) or not to_save:
            raise TypeError(f"`to_save` must be a non-empty mapping of names to objects, got {to_save!r}.")
        if include_self and not isinstance(to_save, MutableMapping):
            raise TypeError(
                f"`include_self=True` needs `to_save` to be mutable (a dict), got {type(to_save).__name__}."
            )
        if include_self and "checkpointer" in to_save:
            raise ValueError(
                "`to_save` has the key 'checkpointer', which `include_self=True` saves this handler under."
            )
        if score_function is None and score_name is not None:
            score_function = self.get_default_score_fn(score_name)
        if score_function is not None and not callable(score_function):
            raise TypeError(f"`score_function` must be callable as score_function(engine), got {score_function!r}.")
        if global_step_transform is not None and not callable(global_step_transform):
            raise TypeError(
                "`global_step_transform` must be callable as global_step_transform(engine, event_name), "
                f"got {global_step_transform!r}."
            )
        if filename_pattern is not None and not isinstance(filename_pattern, str):
            raise TypeError(f"`filename_pattern` must be a str or None, got {type(filename_pattern).__name__}.")
        if n_saved is not None and (not isinstance(n_saved, int) or isinstance(n_saved, bool) or n_saved < 1):
            raise ValueError(f"`n_saved` must be a positive int or None (keep every checkpoint), got {n_saved!r}.")
        check_retention(None, None, keep_every, mode)
        if on_error not in ("raise", "warn"):
            raise ValueError(f'`on_error` must be "raise" or "warn", got {on_error!r}.')
        self._kinds = {name: kind_of(name, obj) for name, obj in to_save.items()}
        self.on_error = on_error
        self.to_save = to_save if include_self else dict(to_save)
        self.save_handler, self.store = _where(save_handler)
        self._with_metadata = takes_metadata(self.save_handler) if self.store is None else True
        self.n_saved, self.keep_every = n_saved, keep_every
        self.score_function = score_function
        self.mode: Literal["min", "max"] = mode
        self.score_name = score_name or ("score" if score_function is not None else None)
        self.global_step_transform = global_step_transform
        self.filename_prefix, self.filename_pattern = filename_prefix, filename_pattern
        self.include_self, self.greater_or_equal, self.save_on_rank = include_self, greater_or_equal, save_on_rank
        self._prefix = f"{filename_prefix}_" if filename_prefix else ""  # Ignite's separator: mnist_step_...
        self.background = background
        self._ledger = Ledger.for_checkpoint(
            n_saved=n_saved,
            mode=mode,
            keep_every=keep_every,
            greater_or_equal=greater_or_equal,
        )
        self._seeded = self.store is None  # a store's earlier checkpoints join the ledger at the first save
        self._before: Any = None  # the ledger before the save in flight, put back if that save fails
        self._saved: Saved | None = None  # the checkpoint written (or resumed from) last, and what it holds
        #: seconds the calling (training) thread has spent in this handler's saves: copying, waiting on the last write
        self.blocked = 0.0
        self._save_listeners: list[Callable[[int], None]] = []

    # -- saving ----------------------------------------------------------------------------------

    def __call__(self, engine: Engine) -> None:
        """Save now when retention keeps the new checkpoint (Ignite's rule), then remove what it pushes out.

        Into a store, one step is written once. Fired again at the same step (``ITERATION_COMPLETED(every=N) |
        COMPLETED`` on a run that ends on a multiple of N, or the EPOCH_COMPLETED a resumed run still owed), it
        rewrites only that checkpoint's manifest when its arrays are the very ones saved (or restored) there and its
        score is the same; when the arrays have changed (a handler lowered the learning rate in between), the new
        checkpoint replaces that one. A scored save with another score is another candidate for the best. The time
        the call takes is added to `blocked`.
        """
        start = time.perf_counter()
        try:
            self._save(engine)
        finally:
            self.blocked += time.perf_counter() - start

    def _save(self, engine: Engine) -> None:
        transform = self.global_step_transform
        global_step = int(transform(engine, engine.last_event_name)) if transform is not None else None
        metrics: dict[str, float] = {}
        if self.score_function is not None and self.score_name is not None:
            priority = score_of(self.score_function(engine))
            metrics[self.score_name] = priority
        else:
            global_step = engine.state.iteration if global_step is None else global_step
            priority = global_step
        step = engine.state.iteration if global_step is None else global_step
        if self.store is None:
            saved = self._call_handler(step, global_step, priority, *self._collect())
        else:
            saved = self._save_to_store(engine, step, global_step, priority, metrics)
        for listener in self._save_listeners if saved else ():
            listener(step)

    def add_save_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(step)`` each time a checkpoint of ``step`` is being written (a ledger kept beside it).

        Examples:
            >>> import tempfile
            >>> from ember import Engine, Events
            >>> from ember.handlers import Checkpoint
            >>> trainer, steps = Engine(lambda e, b: b), []
            >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp())
            >>> saver.add_save_listener(steps.append)
            >>> _ = saver.attach(trainer, Events.ITERATION_COMPLETED(every=2))
            >>> _ = trainer.run(range(5)); steps
            [2, 4]
        """
        if not callable(listener):
            raise TypeError(f"`listener` must be callable as listener(step), got {listener!r}.")
        self._save_listeners.append(listener)

    def _collect(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """What a checkpoint of now holds: every object's state dict, and the arrays of the tree-stateful ones."""
        states = {k: obj.state_dict() for k, obj in self.to_save.items() if isinstance(obj, Stateful)}
        trees = {k: obj.tree_state_dict() for k, obj in self.to_save.items() if self._kinds[k] == "tree"}
        return states, trees

    def _save_to_store(
        self, engine: Engine, step: int, global_step: int | None, priority: float, metrics: dict[str, float]
    ) -> bool:
        """Save into the store if retention admits it; return whether it wrote a checkpoint.

        The state dicts are collected only then: a best checkpoint that did not improve costs the training thread
        no copy.
        """
        assert self.store is not None
        outer = engine.outer_engine  # an evaluator's run inside a trainer's: the trainer's run ends the writing
        for watched in (engine,) if outer is None else (engine, outer):
            if not watched.has_event_handler(self._finish, Events.COMPLETED):  # add_event_handler, Ignite's way
                self._watch(watched)
        default = f"{self._prefix}step_{step:08d}" + (f"-{self.score_name}={priority:.4f}" if metrics else "")
        name = self._name(global_step, priority, default=default)
        saved = self._saved if self._saved is not None and self._saved.step == step else None
        collected = self._collect() if saved is not None else None
        if saved is not None and collected is not None and saved.metrics == metrics and saved.holds(collected[1]):
            if saved.states != self._with_self(collected[0]):
                self._amend(saved, self._with_self(collected[0]))
            return False
        replaces = saved.name if saved is not None and not metrics else None  # a new score is a new best candidate
        if self.store.writing:
            self._wait()  # the previous save is on disk, older ones removed: names are settled
        self._seed()
        if replaces is None and self._is_checkpoint(name):
            replaces = name  # a checkpoint of this step from before (a relaunch): this one takes its place
        if not self._ledger.admits(step, priority, replacing=replaces):
            return False
        states, trees = collected if collected is not None else self._collect()
        self._before = self._ledger.snapshot()
        gone = [e.filename for e in self._ledger.add(name, step, priority) if e.filename not in (name, replaces)]
        if replaces is not None and replaces != name:
            self._ledger.forget(replaces)
        states = self._with_self(states)
        metadata = {"state_dicts": states, "checkpoint": self._metadata(priority)}

        def remove_gone() -> None:
            if jax.process_index() == 0:  # only process 0 deletes, as it alone commits
                for old in gone:
                    self.store.delete(old)  # type: ignore[union-attr]  # a store: tested above

        with self._failures():
            if self.background:
                self.store.save_in_background(
                    trees, step=step, metrics=metrics, metadata=metadata, name=name, then=remove_gone, replaces=replaces
                )
            else:
                self.store.save(trees, step=step, metrics=metrics, metadata=metadata, name=name, replaces=replaces)
                remove_gone()
                self._before = None
        self._saved = Saved.of(step, name, trees, states, metrics)
        if self.background and engine.last_event_name is Events.COMPLETED and outer is None:
            self._wait()  # the run ends here; a watcher added just now would not run in this firing
        return True

    def _with_self(self, states: dict[str, Any]) -> dict[str, Any]:
        return {**states, "checkpointer": self.state_dict()} if self.include_self else states

    def _amend(self, saved: Saved, states: dict[str, Any]) -> None:
        """Write the new state dicts into the manifest of the checkpoint ``saved`` describes; its arrays stay."""
        assert self.store is not None
        with self._failures():
            if self.background:
                self.store.amend_in_background(saved.name, metadata={"state_dicts": states})
            else:
                self.store.amend(saved.name, metadata={"state_dicts": states})
        saved.states = states

    @contextlib.contextmanager
    def _failures(self) -> Generator[None]:
        """Let a failed write raise, or with ``on_error="warn"`` turn it into a warning; the ledger is put back."""
        try:
            yield
        except OSError as e:
            if self._before is not None:
                self._ledger.restore(self._before)
                self._before = None
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
        to_load: Mapping[str, Any],
        checkpoint: CheckpointInfo | Store | Mapping[str, Any] | str | os.PathLike[str],
    ) -> CheckpointInfo | None:
        """Ignite's ``Checkpoint.load_objects``: from a checkpoint's folder, a folder (its latest), or a dict.

        A dict is what a save handler of yours received (a single object's state as it is, as Ignite's); ``None`` is
        returned for it, the checkpoint's info otherwise ([`load_objects`][ember.handlers.load_objects]).

        Examples:
            >>> import tempfile
            >>> from ember import Engine
            >>> from ember.handlers import Checkpoint
            >>> trainer, folder = Engine(lambda e, b: b), tempfile.mkdtemp()
            >>> _ = trainer.run([1, 2]); _ = Checkpoint({"trainer": trainer}, folder).save_now(trainer)
            >>> Checkpoint.load_objects({"trainer": Engine(lambda e, b: b)}, folder + "/step_00000002").step
            2
            >>> fresh = Engine(lambda e, b: b)
            >>> Checkpoint.load_objects({"trainer": fresh}, {"epoch_length": 2, "iteration": 1, "max_epochs": 1})
            >>> fresh.state.iteration
            1
        """
        return load_objects(to_load, checkpoint)

    def attach(
        self, engine: Engine, event: Events | FilteredEvent | EventsList = Events.EPOCH_COMPLETED
    ) -> RemovableEventHandle:
        """Save on ``event``; surface background errors each iteration; finish writing at COMPLETED.

        With background writes, a checkpoint retention no longer keeps is deleted on the writer thread once the new
        one is committed, so the training thread waits for neither; COMPLETED waits for the last save. Attached to an
        evaluator's COMPLETED, each save is finished before the evaluator's run returns, unless that run was started
        from another engine's handler (``Evaluate`` on a trainer): then the trainer goes on while the save is written,
        its iterations surface a failed write, and its COMPLETED waits for the last one.

        Examples:
            >>> import tempfile
            >>> from ember import Engine, Events
            >>> from ember.handlers import Checkpoint
            >>> trainer = Engine(lambda e, b: b)
            >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp())
            >>> _ = saver.attach(trainer, Events.ITERATION_COMPLETED(every=2))
        """
        with collect_handles() as made:
            engine.add_event_handler(event, self)
            if self.store is not None:
                self._watch(engine)
        return made.handle


def _where(save_handler: Any) -> tuple[Any, Store | None]:
    """The handler as kept in ``save_handler``, and the store it writes to (``None`` for a user's handler)."""
    if isinstance(save_handler, Store):
        return save_handler, save_handler
    if isinstance(save_handler, DiskSaver):
        return save_handler, save_handler.store
    if isinstance(save_handler, str | os.PathLike):
        saver = DiskSaver(save_handler, require_empty=False)
        return saver, saver.store
    if save_handler is None:
        raise TypeError("`save_handler` is required: a folder, a CheckpointStore, a DiskSaver or a save handler.")
    if callable(save_handler):
        return save_handler, None
    raise TypeError(
        "`save_handler` must be a folder, a CheckpointStore, a DiskSaver, or a callable "
        f"(checkpoint, filename, metadata) such as a BaseSaveHandler; got {type(save_handler).__name__}."
    )


def checkpoints_given(checkpoints: Sequence[Any]) -> list[Checkpoint]:
    """``checkpoints`` as a list, a ``TypeError`` naming the first that is not a `Checkpoint` (a watcher's argument)."""
    for c in checkpoints:
        if not isinstance(c, Checkpoint):
            raise TypeError(f"`checkpoints` must hold ember.handlers.Checkpoint objects, got {type(c).__name__}.")
    return list(checkpoints)
