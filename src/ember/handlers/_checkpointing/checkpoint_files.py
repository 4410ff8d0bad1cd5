"""`StoreWriting`: a `Checkpoint`'s saves into one of ember's stores, its background writes, and its relaunch."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, Literal

import jax

from ember.checkpoint import CheckpointInfo
from ember.checkpoint._stores import Store
from ember.engine import Engine, Events
from ember.handlers._checkpointing.checkpoint_names import Naming, score_key
from ember.handlers._checkpointing.readers import CheckpointReader
from ember.handlers._checkpointing.retention import Ledger, failures
from ember.handlers._checkpointing.same_arrays import Saved

#: What a checkpoint of now holds: every object's state dict, and the arrays of the tree-stateful ones.
Collect = Callable[[], tuple[dict[str, Any], dict[str, Any]]]


_RUN_ENDS = (Events.COMPLETED, Events.EXCEPTION_RAISED)  # a save there is on disk before the handler returns


class StoreWriting:
    """What a [`Checkpoint`][ember.handlers.Checkpoint] does with a store: it holds one of these.

    It owns what only a store has: the checkpoint written last (to amend it rather than write its arrays again),
    whether the store's earlier checkpoints have joined the ledger (a relaunch), the background writes (waited for,
    their errors surfaced each iteration), and finishing at COMPLETED.
    """

    def __init__(
        self,
        store: Store,
        ledger: Ledger,
        naming: Naming,
        *,
        background: bool,
        on_error: Literal["raise", "warn"],
        mode: Literal["min", "max"],
    ) -> None:
        self.store, self.ledger, self.naming, self.background = store, ledger, naming, background
        self.on_error: Literal["raise", "warn"] = on_error
        self.mode: Literal["min", "max"] = mode
        self.saved: Saved | None = None  # the checkpoint written (or resumed from) last, and what it holds
        self._seeded = False  # the store's earlier checkpoints join the ledger at the first save

    def save(
        self,
        engine: Engine,
        to_save: Mapping[str, Any],
        collect: Collect,
        with_self: Callable[[dict[str, Any]], dict[str, Any]],
        step: int,
        global_step: int | None,
        priority: float,
        metrics: dict[str, float],
    ) -> bool:
        """Save into the store if retention admits it; return whether it wrote a checkpoint.

        The state dicts are collected only then: a best checkpoint that did not improve costs the training thread
        no copy.
        """
        outer = engine.outer_engine  # an evaluator's run inside a trainer's: the trainer's run ends the writing
        self._watching(engine, outer)
        name = self.naming.store_name(to_save, step, global_step, priority, scored=bool(metrics))
        saved = self.saved if self.saved is not None and self.saved.step == step else None
        collected = collect() if saved is not None else None
        if saved is not None and collected is not None and saved.metrics == metrics and saved.holds(collected[1]):
            if saved.states != with_self(collected[0]):
                self.amend(saved, with_self(collected[0]))
            return False
        replaces = saved.name if saved is not None and not metrics else None  # a new score is a new best candidate
        if self.store.writing:
            self.wait()  # the previous save is on disk, older ones removed: names are settled
        self.seed(to_save)
        if replaces is None and self.store.find(name) is not None:
            replaces = name  # a checkpoint of this step from before (a relaunch): this one takes its place
        if not self.ledger.admits(step, priority, replacing=replaces):
            return False
        states, trees = collected if collected is not None else collect()
        self.ledger.begin()
        gone = [e.filename for e in self.ledger.add(name, step, priority) if e.filename not in (name, replaces)]
        if replaces is not None and replaces != name:
            self.ledger.forget(replaces)
        states = with_self(states)
        metadata = {"state_dicts": states, "checkpoint": self.naming.metadata(to_save, priority)}

        remove_gone = functools.partial(self._remove, gone)
        with failures(self.on_error, self.ledger):
            if self.background:
                self.store.save_in_background(
                    trees, step=step, metrics=metrics, metadata=metadata, name=name, then=remove_gone, replaces=replaces
                )
            else:
                self.store.save(trees, step=step, metrics=metrics, metadata=metadata, name=name, replaces=replaces)
                remove_gone()
                self.ledger.settle()
        self.saved = Saved.of(step, name, trees, states, metrics)
        if self.background and engine.last_event_name in _RUN_ENDS and outer is None:
            self.wait()  # the run ends here; a watcher added just now would not run in this firing
        return True

    def _watching(self, engine: Engine, outer: Engine | None) -> None:
        """Watch the engines a save fires on (added with ``add_event_handler``, Ignite's way, rather than attached)."""
        for watched in (engine,) if outer is None else (engine, outer):
            if not watched.has_event_handler(self.finish, Events.COMPLETED):
                self.watch(watched)

    def _remove(self, gone: list[str]) -> None:
        """Delete the checkpoints retention no longer keeps, once their successor is on disk (process 0 alone)."""
        if jax.process_index() == 0:  # only process 0 deletes, as it alone commits
            for old in gone:
                self.store.delete(old)

    def amend(self, saved: Saved, states: dict[str, Any]) -> None:
        """Write the new state dicts into the manifest of the checkpoint ``saved`` describes; its arrays stay."""
        with failures(self.on_error, self.ledger):
            if self.background:
                self.store.amend_in_background(saved.name, metadata={"state_dicts": states})
            else:
                self.store.amend(saved.name, metadata={"state_dicts": states})
        saved.states = states

    def best_on_disk(self) -> CheckpointInfo:
        """Once the save in flight is on disk: the best checkpoint kept (``save_now``'s answer), found in the store."""
        self.wait()
        best = self.ledger.best()
        if best is None:
            raise RuntimeError(f"No checkpoint could be written to {self.store.root}.")
        info = self.store.find(best.filename)
        if info is None:
            raise RuntimeError(
                f"The checkpoint {best.filename!r} is not in {self.store.root}, although it was just written."
            )
        return info

    def wait(self) -> CheckpointInfo | None:
        """The background save in flight, once on disk (its error raised, or warned of); ``None`` if none."""
        info = None
        with failures(self.on_error, self.ledger):
            info = self.store.wait()
        self.ledger.settle()
        return info

    def resume(
        self, reader: Any, to_load: Mapping[str, Any], trees: Callable[[], dict[str, Any]]
    ) -> CheckpointInfo | None:
        """Restore ``to_load`` through ``reader`` (this store's latest by default); remember what was restored."""
        reader = reader if reader is not None else CheckpointReader(self.store)
        if not isinstance(reader, CheckpointReader):
            raise TypeError(f"`reader` must be a CheckpointReader, got {type(reader).__name__}.")
        info = reader.load(to_load)
        if info is not None and self.store.holds(info):  # saving this step again amends it
            states = info.manifest.get("metadata", {}).get("state_dicts", {})
            self.saved = Saved.of(info.step, info.path.name, trees(), states, dict(info.metrics))
        return info

    def mine(self, to_save: Mapping[str, Any]) -> list[CheckpointInfo]:
        """This handler's valid checkpoints in the store, oldest first."""
        return [c for c in self.store.checkpoints() if self.naming.is_mine(c, to_save)]

    def seed(self, to_save: Mapping[str, Any]) -> None:
        """At the first save, the handler's checkpoints already in the store join what it keeps (a relaunch)."""
        if self._seeded:
            return
        self._seeded = True
        score_name, scored = score_key(self.naming.score_name), self.naming.scored
        worst = float("-inf") if self.mode == "max" else float("inf")
        found = []
        for info in self.mine(to_save):
            recorded = info.manifest.get("metadata", {}).get("checkpoint") or {}
            if "priority" in recorded:
                priority = recorded["priority"]
            elif scored:
                priority = info.metrics.get(score_name, worst)
            else:
                priority = info.step
            found.append((info.path.name, info.step, priority))
        self.ledger.seed(found)

    def seeded(self) -> None:
        """The ledger was set from elsewhere (``reset``, ``load_state_dict``): the store's checkpoints stay out."""
        self._seeded = True

    def check(self) -> None:
        """Every iteration: a failed background write surfaces at the next one."""
        if self.store.writing:
            try:
                self.store.raise_if_failed()
            except OSError as failed:  # the failure handling (raise, or warn) only when there is a failure
                with failures(self.on_error, self.ledger):
                    raise failed

    def finish(self, engine: Engine) -> None:
        """At COMPLETED: the saves are on disk, and the store has made them as safe as it makes any (``finish``)."""
        if engine.outer_engine is not None:
            return
        if self.background:
            self.wait()
        with failures(self.on_error, self.ledger):
            self.store.finish()

    def watch(self, engine: Engine) -> None:
        """Surface background errors each iteration; finish writing at COMPLETED (after a save there)."""
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.check)
        engine.add_event_handler(Events.COMPLETED, self.finish)
