"""`Checkpoint`: save what a run needs to resume, on any event, keeping Ignite's ``n_saved`` best or newest.

Also its arguments' checks (`check_arguments`) and the event it fires once it has saved (`CheckpointEvents`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any, Literal

from ember.checkpoint import CheckpointInfo, check_retention
from ember.checkpoint._store import Store
from ember.engine import (
    Engine,
    EventEnum,
    Events,
    EventsList,
    FilteredEvent,
    RemovableEventHandle,
    Stateful,
    collect_handles,
)
from ember.handlers._attached import hold
from ember.handlers._checkpointing.checkpoint_names import Naming, metric_score, ranked
from ember.handlers._checkpointing.loading import kind_of, load_objects
from ember.handlers._checkpointing.retention import Item, Ledger
from ember.handlers._checkpointing.save_handlers import SaveHandler, setup_filename_pattern
from ember.handlers._checkpointing.savers import DiskSaver
from ember.handlers._checkpointing.saving import Saving, destination


class CheckpointEvents(EventEnum):
    """Events a [`Checkpoint`][ember.handlers.Checkpoint] fires on the engine it saves on (Ignite's, by its name).

    ``SAVED_CHECKPOINT`` fires after each checkpoint the handler writes (retention admitted it), on the training
    thread; into a store with background writes the checkpoint is then scheduled, its arrays copied, and
    ``saver.wait()`` returns once it is on disk; ``engine.last_event_name`` stays the event that saved. The handler
    registers the event on its engine at its first save, or at ``attach`` (Ignite registers it at the first save
    only): to handle it before, register it yourself with ``engine.register_events(*CheckpointEvents)``. Also
    reachable as ``Checkpoint.SAVED_CHECKPOINT``.

    Examples:
        >>> import tempfile
        >>> from ember import Engine, Events
        >>> from ember.handlers import Checkpoint
        >>> trainer = Engine(lambda e, b: b)
        >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp())
        >>> _ = saver.attach(trainer, Events.EPOCH_COMPLETED)
        >>> @trainer.on(Checkpoint.SAVED_CHECKPOINT)
        ... def saved(engine):
        ...     print("saved at epoch", engine.state.epoch)
        >>> _ = trainer.run([1, 2], max_epochs=2)
        saved at epoch 1
        saved at epoch 2
    """

    SAVED_CHECKPOINT = "saved_checkpoint"


def registered(engine: Engine) -> Engine:
    """``engine``, with `CheckpointEvents` registered on it (once)."""
    if not engine.has_registered_events(CheckpointEvents.SAVED_CHECKPOINT):
        engine.register_events(*CheckpointEvents)
    return engine


def announce_saved(engine: Engine) -> None:
    """Fire ``SAVED_CHECKPOINT`` on ``engine`` within the event that saved; ``last_event_name`` stays that event.

    (Ignite's ``fire_event`` leaves it at ``SAVED_CHECKPOINT``; ember's handlers after the save read it to know where
    the run is: a save at COMPLETED, the epoch a preemption stopped in.)
    """
    during = engine.last_event_name
    registered(engine).fire_event(CheckpointEvents.SAVED_CHECKPOINT)
    engine.last_event_name = during


class Checkpoint:
    """Saves ``to_save`` when its event fires, Ignite's way, into one of ember's stores or a save handler of yours.

    Ignite's arguments: ``Checkpoint(to_save, save_handler, filename_prefix, score_function, score_name, n_saved,
    global_step_transform, filename_pattern, include_self, greater_or_equal, save_on_rank)``. Ignite's rule decides
    what is kept: a new checkpoint is saved while fewer than ``n_saved`` are kept, or when its priority (the score,
    else the global step) beats the lowest kept one's (``>``; ``>=`` with ``greater_or_equal``), and the lowest then
    goes; ``keep_every`` also keeps every step that is a multiple of it.

    Into a store (a folder, a [`CheckpointStore`][ember.checkpoint.CheckpointStore] or a
    [`DiskSaver`][ember.handlers.DiskSaver]), each checkpoint is a folder (``mnist_step_00000400-acc=0.9731``, or
    ``filename_pattern``) written atomically and verified: state dicts (engines, handlers) in the manifest, tree
    states (a trainer's train state) in the array file. Writes run in the background (the host copy is made before
    the handler returns); a failed write is raised at the next iteration and at COMPLETED, which waits until all is
    on disk. A checkpoint retention no longer keeps is deleted once its successor is on disk.

    A ``save_handler`` of your own (a function ``(checkpoint, filename, metadata)`` or Ignite's ``BaseSaveHandler``:
    [`SaveHandler`][ember.handlers.SaveHandler]) is called on the training thread with a dict of host values and
    Ignite's file name (``checkpoint_400.ckpt``), and its ``remove`` for a checkpoint no longer kept.

    Args:
        to_save: what to save, by name.
        save_handler: where: a folder, a [`CheckpointStore`][ember.checkpoint.CheckpointStore], a
            [`DiskSaver`][ember.handlers.DiskSaver], or your own save handler.
        filename_prefix: starts every checkpoint's name, with ``_`` after it (``mnist_step_00000400``).
        score_function: ``score_function(engine) -> float``, e.g. an evaluator's validation accuracy.
        score_name: the score's name in checkpoint names and manifests (Ignite's names leave it out when ``None``; a
            store's folders and manifests call it ``score``); given alone, the score is
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
        keep_while: ``keep_while(step)``: a checkpoint retention would remove stays while this is true (an
            evaluation job has not read it yet); it goes at the first save after. Asked at each save.
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
    #: fired on the engine after each checkpoint written ([`CheckpointEvents`][ember.handlers.CheckpointEvents])
    SAVED_CHECKPOINT = CheckpointEvents.SAVED_CHECKPOINT

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
        keep_while: Callable[[int], bool] | None = None,
        background: bool = True,
        on_error: Literal["raise", "warn"] = "raise",
    ) -> None:
        if score_function is None and score_name is not None:
            score_function = self.get_default_score_fn(score_name)
        checks = (to_save, include_self, score_function, global_step_transform, filename_pattern, n_saved, on_error)
        check_arguments(*checks, keep_every=keep_every, mode=mode, keep_while=keep_while)
        self._kinds = {name: kind_of(name, obj) for name, obj in to_save.items()}
        self.to_save = to_save if include_self else dict(to_save)
        self.save_handler, self.store, to = destination(save_handler, save_on_rank)
        self.n_saved, self.keep_every, self.mode, self.on_error = n_saved, keep_every, mode, on_error
        self.score_function = score_function
        self.score_name = score_name
        self.global_step_transform = global_step_transform
        self.filename_prefix, self.filename_pattern = filename_prefix, filename_pattern
        self.include_self, self.greater_or_equal, self.save_on_rank = include_self, greater_or_equal, save_on_rank
        self.background = background
        self._ledger = Ledger(
            n_saved=n_saved, mode=mode, keep_every=keep_every, greater_or_equal=greater_or_equal, keep_while=keep_while
        )
        naming = Naming(filename_prefix, filename_pattern, self.score_name, score_function is not None, self.ext)
        self._saving = Saving(to, self.store, self._ledger, naming, background=background, on_error=on_error, mode=mode)
        #: seconds the calling (training) thread has spent in this handler's saves: copying, waiting on the last write
        self.blocked = 0.0
        self._save_listeners: list[Callable[[int], None]] = []

    # -- saving ----------------------------------------------------------------------------------

    def __call__(self, engine: Engine, *args: Any) -> None:
        """Save now when retention keeps the new checkpoint (Ignite's rule), then remove what it pushes out.

        What an event passes besides the engine is ignored: attached to ``EXCEPTION_RAISED`` (Ignite's "save on
        exception") it saves the state the failed iteration left, on disk before the exception goes on, and fires
        ``SAVED_CHECKPOINT`` after each checkpoint it writes.

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
        rank = ranked(engine, self.score_function, self.score_name, self.global_step_transform)
        own = self.state_dict if self.include_self else None
        if self._saving.save(engine, self.to_save, self._collect, own, rank):
            for listener in self._save_listeners:
                listener(rank.step)
            announce_saved(engine)

    def _given(self, to_save: Mapping[str, Any]) -> None:
        """What to save from now on (a ``ModelCheckpoint`` is given it at each call)."""
        self.to_save, self._kinds = dict(to_save), {name: kind_of(name, obj) for name, obj in to_save.items()}

    def _collect(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """What a checkpoint of now holds: every object's state dict, and the arrays of the tree-stateful ones."""
        states = {k: obj.state_dict() for k, obj in self.to_save.items() if isinstance(obj, Stateful)}
        return states, self._trees()

    def _trees(self) -> dict[str, Any]:
        return {k: obj.tree_state_dict() for k, obj in self.to_save.items() if self._kinds[k] == "tree"}

    def _ledger_given(self) -> None:
        """The ledger was set here (``reset``, a loaded state): settled, the store's checkpoints kept out of it."""
        self._ledger.settle()
        self._saving.seeded()

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

    def save_now(self, engine: Engine) -> CheckpointInfo:
        """Save, wait until the checkpoint is on disk, and return [`last_checkpoint`]'s info.

        When retention does not keep a checkpoint of this score, nothing is written and the best kept is returned.

        Examples:
            >>> import tempfile
            >>> from ember import Engine
            >>> from ember.handlers import Checkpoint
            >>> trainer = Engine(lambda e, b: b)
            >>> _ = trainer.run([1, 2])
            >>> Checkpoint({"trainer": trainer}, tempfile.mkdtemp()).save_now(trainer).step
            2
        """
        self._saving.needs_store("save_now()")
        self(engine)
        return self._saving.best_on_disk()

    def wait(self) -> CheckpointInfo | None:
        """Wait for a background save to be on disk (raising its error); return it, or ``None`` if none was in flight.

        Examples:
            >>> import tempfile
            >>> from ember import Engine, Events
            >>> from ember.handlers import Checkpoint
            >>> trainer = Engine(lambda e, b: b)
            >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp())
            >>> _ = trainer.add_event_handler(Events.ITERATION_COMPLETED, saver)
            >>> @trainer.on(Events.ITERATION_COMPLETED(once=2))
            ... def on_disk(engine):
            ...     print(saver.last_checkpoint.name, saver.wait().step)
            >>> _ = trainer.run([1, 2])
            step_00000002 2
        """
        return self._saving.wait()

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
        return self._saving.resume(reader, self.to_save, self._trees)

    def latest_committed(self) -> CheckpointInfo | None:
        """The newest checkpoint of this handler committed on disk, or ``None``.

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
        mine = self._saving.mine(self.to_save)
        return mine[-1] if mine else None

    @property
    def last_checkpoint(self) -> Path | str | None:
        """The checkpoint Ignite's ``last_checkpoint`` names: the best kept (by score, else the newest), or ``None``.

        A ``pathlib.Path`` (the checkpoint's folder) with a store, the file name with your own save handler. It is
        set as soon as the save is scheduled, so a background write may still be in flight: ``saver.wait()``
        returns once it is on disk. A relaunched handler knows the checkpoints of its own already in the store.
        """
        self._saving.seed(self.to_save)
        best = self._ledger.best()
        return None if best is None else self._saving.to.path_of(best.filename)

    def reset(self) -> None:
        """Forget the checkpoints kept so far (Ignite's ``reset``): later saves never remove them.

        Call it at STARTED when one handler serves several independent runs (folds).

        Examples:
            >>> import tempfile
            >>> from ember import Engine
            >>> from ember.handlers import Checkpoint
            >>> trainer = Engine(lambda e, b: b)
            >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp())
            >>> _ = trainer.run([1, 2]); _ = saver.save_now(trainer)
            >>> saver.reset(); print(saver.last_checkpoint)
            None
        """
        self._ledger.restore(([], 0))
        self._ledger_given()

    def state_dict(self) -> dict[str, Any]:
        """What this handler keeps, as Ignite's ``{"_saved": [(priority, filename), ...]}`` (and steps to pin).

        Examples:
            >>> import tempfile
            >>> from ember import Engine
            >>> from ember.handlers import Checkpoint
            >>> trainer = Engine(lambda e, b: b)
            >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp())
            >>> _ = trainer.run([1, 2]); _ = saver.save_now(trainer)
            >>> saver.state_dict()
            {'_saved': [(2, 'step_00000002')]}
        """
        self._saving.seed(self.to_save)
        return self._ledger.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Take over what a saved handler kept; its checkpoints are removed as later saves push them out.

        Examples:
            >>> import tempfile
            >>> from ember import Engine
            >>> from ember.handlers import Checkpoint
            >>> saver = Checkpoint({"trainer": Engine(lambda e, b: b)}, tempfile.mkdtemp())
            >>> saver.load_state_dict({"_saved": [(4, "step_00000004")]}); saver.last_checkpoint.name
            'step_00000004'
        """
        self._ledger.load_state_dict(state_dict)
        self._ledger_given()

    @staticmethod
    def setup_filename_pattern(
        with_prefix: bool = True, with_score: bool = True, with_score_name: bool = True, with_global_step: bool = True
    ) -> str:
        """Ignite's default file name pattern, with the parts asked for.

        Examples:
            >>> from ember.handlers import Checkpoint
            >>> Checkpoint.setup_filename_pattern(with_score=False, with_score_name=False)
            '{filename_prefix}_{name}_{global_step}.{ext}'
        """
        return setup_filename_pattern(with_prefix, with_score, with_score_name, with_global_step)

    @staticmethod
    def get_default_score_fn(metric_name: str, score_sign: float = 1.0) -> Callable[[Engine], float]:
        """A ``score_function`` reading ``engine.state.metrics[metric_name]``, times ``score_sign`` (1 or -1).

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import Checkpoint
            >>> engine = Engine(lambda e, b: b)
            >>> engine.state.metrics["loss"] = 0.25
            >>> Checkpoint.get_default_score_fn("loss", -1.0)(engine)
            -0.25
        """
        return metric_score(metric_name, score_sign)

    @staticmethod
    def load_objects(
        to_load: Mapping[str, Any],
        checkpoint: CheckpointInfo | Store | Mapping[str, Any] | str | os.PathLike[str],
        *,
        strict: bool = True,
    ) -> CheckpointInfo | None:
        """Ignite's ``Checkpoint.load_objects``: from a checkpoint's folder, a folder (its latest), or a dict.

        A dict is what a save handler of yours received (a single object's state as it is, as Ignite's); ``None`` is
        returned for it, the checkpoint's info otherwise ([`load_objects`][ember.handlers.load_objects]).
        ``strict=False`` (Ignite's) loads what the checkpoint and the objects share, and warns of the rest.

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
        return load_objects(to_load, checkpoint, strict=strict)

    def attach(
        self, engine: Engine, event: Events | FilteredEvent | EventsList = Events.EPOCH_COMPLETED
    ) -> RemovableEventHandle:
        """Save on ``event``; surface background errors each iteration; finish writing at COMPLETED.

        With background writes, a checkpoint retention no longer keeps is deleted on the writer thread once the new
        one is committed, so the training thread waits for neither; COMPLETED waits for the last save. Attached to an
        evaluator's COMPLETED, each save is finished before the evaluator's run returns, unless that run was started
        from another engine's handler (``Evaluate`` on a trainer): then the trainer goes on while the save is written,
        its iterations surface a failed write, and its COMPLETED waits for the last one. Another `Checkpoint` attached
        to the same engine and writing into the same folder is refused (a notebook cell run again): remove it first.

        Examples:
            >>> import tempfile
            >>> from ember import Engine, Events
            >>> from ember.handlers import Checkpoint
            >>> trainer = Engine(lambda e, b: b)
            >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp())
            >>> _ = saver.attach(trainer, Events.ITERATION_COMPLETED(every=2))
        """
        folder = getattr(self.store, "root", None)
        with collect_handles() as made:
            if folder is not None:
                held = (
                    f"Another Checkpoint attached to this engine writes into {folder}: remove it first "
                    "(handle.remove() on the handle its attach returned), or give this one another folder."
                )
                hold(engine, folder, self, made, refuse=True, if_held=held)
            registered(engine)
            engine.add_event_handler(event, self)
            self._saving.watch(engine)
        return made.handle


def checkpoints_given(checkpoints: Sequence[Any]) -> list[Checkpoint]:
    """``checkpoints`` as a list, a ``TypeError`` naming the first that is not a `Checkpoint` (a watcher's argument)."""
    for c in checkpoints:
        if not isinstance(c, Checkpoint):
            raise TypeError(f"`checkpoints` must hold ember.handlers.Checkpoint objects, got {type(c).__name__}.")
    return list(checkpoints)


def check_arguments(
    to_save: Any,
    include_self: bool,
    score_function: Any,
    global_step_transform: Any,
    filename_pattern: Any,
    n_saved: Any,
    on_error: Any,
    *,
    keep_every: Any,
    mode: Any,
    keep_while: Any = None,
) -> None:
    """`Checkpoint`'s arguments checked, each a clear error naming it."""
    if not isinstance(to_save, Mapping) or not to_save:
        raise TypeError(f"`to_save` must be a non-empty mapping of names to objects, got {to_save!r}.")
    if include_self and not isinstance(to_save, MutableMapping):
        raise TypeError(f"`include_self=True` needs `to_save` to be mutable (a dict), got {type(to_save).__name__}.")
    if include_self and "checkpointer" in to_save:
        raise ValueError("`to_save` has the key 'checkpointer', which `include_self=True` saves this handler under.")
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
    if on_error not in ("raise", "warn"):
        raise ValueError(f'`on_error` must be "raise" or "warn", got {on_error!r}.')
    if keep_while is not None and not callable(keep_while):
        raise TypeError(f"`keep_while` must be callable as keep_while(step) -> bool, got {keep_while!r}.")
    check_retention(None, None, keep_every, mode)
