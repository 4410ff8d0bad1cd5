"""`CheckpointFiles`: the store side of a `Checkpoint`: waiting for writes, finding its checkpoints, resuming."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Literal

from ember.checkpoint import CheckpointInfo
from ember.checkpoint._stores import Store
from ember.engine import Engine, Events
from ember.handlers._readers import CheckpointReader
from ember.handlers._retention import Ledger
from ember.handlers._same_arrays import Saved


class CheckpointFiles:
    """What a [`Checkpoint`][ember.handlers.Checkpoint] does with a store: it inherits this."""

    store: Store | None
    to_save: Mapping[str, Any]
    score_name: str | None
    score_function: Any
    mode: Literal["min", "max"]
    background: bool
    _prefix: str
    _kinds: dict[str, str]
    _ledger: Ledger
    _seeded: bool
    _before: Any
    _saved: Saved | None

    def _failures(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def __call__(self, engine: Engine) -> None:
        raise NotImplementedError

    def _metadata(self, priority: float) -> dict[str, Any]:
        raise NotImplementedError

    def _store(self, what: str) -> Store:
        if self.store is None:
            raise TypeError(
                f"{what} reads ember's checkpoint store; this Checkpoint saves through your own save_handler. Load "
                "what it saved with Checkpoint.load_objects(to_load, checkpoint_dict)."
            )
        return self.store

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
        store = self._store("save_now()")
        self(engine)
        self._wait()
        best = self._ledger.best()
        if best is None:
            raise RuntimeError(f"No checkpoint could be written to {store.root}.")
        info = store.find(best.filename)
        if info is None:
            raise RuntimeError(
                f"The checkpoint {best.filename!r} is not in {store.root}, although it was just written."
            )
        return info

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
        if self.store is None:
            return None
        info = None
        with self._failures():
            info = self.store.wait()
        self._before = None
        return info

    def _wait(self) -> None:
        self.wait()

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
        store = self._store("resume()")
        reader = reader if reader is not None else CheckpointReader(store)
        if not isinstance(reader, CheckpointReader):
            raise TypeError(f"`reader` must be a CheckpointReader, got {type(reader).__name__}.")
        info = reader.load(self.to_save)
        if info is not None and store.holds(info):  # saving this step again amends it
            trees = {k: obj.tree_state_dict() for k, obj in self.to_save.items() if self._kinds[k] == "tree"}
            states = info.manifest.get("metadata", {}).get("state_dicts", {})
            self._saved = Saved.of(info.step, info.path.name, trees, states, dict(info.metrics))
        return info

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
        mine = [c for c in self._store("latest_committed()").checkpoints() if self._is_mine(c)]
        return mine[-1] if mine else None

    def _is_mine(self, info: CheckpointInfo) -> bool:
        """Whether ``info`` was written by a handler like this one: its basename, or (older ones) its prefix."""
        recorded = info.manifest.get("metadata", {}).get("checkpoint")
        if isinstance(recorded, Mapping) and "basename" in recorded:
            return recorded["basename"] == self._metadata(0)["basename"]
        return info.path.name.startswith(self._prefix)

    def _seed(self) -> None:
        """At the first save, the handler's checkpoints already in the store join what it keeps (a relaunch)."""
        if self._seeded or self.store is None:
            return
        self._seeded = True
        scored = self.score_function is not None and self.score_name is not None
        worst = float("-inf") if self.mode == "max" else float("inf")
        found = []
        for info in self.store.checkpoints():
            if not self._is_mine(info):
                continue
            recorded = info.manifest.get("metadata", {}).get("checkpoint") or {}
            if "priority" in recorded:
                priority = recorded["priority"]
            elif scored:
                priority = info.metrics.get(self.score_name, worst)  # type: ignore[arg-type]  # scored: a name
            else:
                priority = info.step
            found.append((info.path.name, info.step, priority))
        self._ledger.seed(found)

    def _is_checkpoint(self, name: str) -> bool:
        """Whether a valid checkpoint is named ``name`` (a damaged one the store moves aside as it writes)."""
        return self._store("a save").find(name) is not None

    def _check(self) -> None:  # every iteration: a failed background write surfaces at the next one
        if self.store is not None and self.store.writing:
            try:
                self.store.raise_if_failed()
            except OSError as failed:  # the failure handling (raise, or warn) only when there is a failure
                with self._failures():
                    raise failed

    def _finish(self, engine: Engine) -> None:
        """At COMPLETED: the saves are on disk, and the store has made them as safe as it makes any (``finish``)."""
        if engine.outer_engine is not None or self.store is None:
            return
        if self.background:
            self._wait()
        with self._failures():
            self.store.finish()

    def _watch(self, engine: Engine) -> None:
        """Surface background errors each iteration; finish writing at COMPLETED (after a save there)."""
        engine.add_event_handler(Events.ITERATION_COMPLETED, self._check)
        engine.add_event_handler(Events.COMPLETED, self._finish)
