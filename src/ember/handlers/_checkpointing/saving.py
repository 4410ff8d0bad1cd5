"""`Saving`: a `Checkpoint`'s one save path, over one destination (a store of ember's, or a save handler of yours).

`Saved` is what it compares to tell whether a save repeats the last one: its step, states, score and arrays.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ember.checkpoint import CheckpointInfo
from ember.checkpoint._store import Store
from ember.engine import Engine, Events
from ember.handlers._checkpointing.checkpoint_names import Naming, Ranked, score_key
from ember.handlers._checkpointing.destinations import Destination, Record
from ember.handlers._checkpointing.readers import CheckpointReader
from ember.handlers._checkpointing.retention import Ledger, failures

#: What a checkpoint of now holds: every object's state dict, and the arrays of the tree-stateful ones.
Collect = Callable[[], tuple[dict[str, Any], dict[str, Any]]]

_RUN_ENDS = (Events.COMPLETED, Events.EXCEPTION_RAISED)  # a save there is on disk before the handler returns


class Saving:
    """What a [`Checkpoint`][ember.handlers.Checkpoint] does to save: it holds one of these.

    One path for every destination: retention decides (Ignite's rule, `Ledger`), the record is written (in the
    background, or followed by a wait), and what retention pushed out is removed once the new one is on disk. A save
    of the step written last, with the very arrays and score it holds, rewrites only its state dicts (`Record.amend`)
    or nothing. It also owns the writes in flight (waited for, their errors surfaced each iteration) and, with one of
    ember's stores, what the store already holds (a relaunch's checkpoints join the ledger; resume).
    """

    def __init__(
        self,
        to: Destination,
        store: Store | None,
        ledger: Ledger,
        naming: Naming,
        *,
        background: bool,
        on_error: Literal["raise", "warn"],
        mode: Literal["min", "max"],
    ) -> None:
        self.to, self.store, self.ledger, self.naming, self.background = to, store, ledger, naming, background
        self.on_error: Literal["raise", "warn"] = on_error
        self.mode: Literal["min", "max"] = mode
        self.saved: Saved | None = None  # the checkpoint written (or resumed from) last, and what it holds
        self._seeded = store is None  # the store's earlier checkpoints join the ledger at the first save

    def save(
        self,
        engine: Engine,
        to_save: Mapping[str, Any],
        collect: Collect,
        own: Callable[[], dict[str, Any]] | None,
        rank: Ranked,
    ) -> bool:
        """Save if retention admits it; return whether a checkpoint was written.

        The state dicts are collected only then: a best checkpoint that did not improve costs the training thread
        no copy. ``own`` gives the `Checkpoint`'s own state dict (``include_self``), taken once the ledger has the
        new checkpoint, as Ignite takes it.
        """
        step, _, priority, metrics = rank
        outer = engine.outer_engine  # an evaluator's run inside a trainer's: the trainer's run ends the writing
        self._watching(engine, outer)
        name = self.to.name(self.naming, to_save, rank)
        saved = self.saved if self.to.steps_once and self.saved is not None and self.saved.step == step else None
        collected = collect() if saved is not None else None
        if saved is not None and collected is not None and saved.metrics == metrics and saved.holds(collected[1]):
            self.seed(to_save)  # the step resumed from, saved again (a stop before training): the ledger knows it
            states, trees = collected
            mine = own() if own is not None else None
            if saved.states != _with(states, mine):
                about = self.naming.metadata(to_save, priority)
                self._write(Record(saved.name, step, metrics, states, trees, about, mine, amend=True))
                saved.states = _with(states, mine)
            return False
        replaces = saved.name if saved is not None and not metrics else None  # a new score is a new best candidate
        self.wait()  # the previous save is on disk, older ones removed: names are settled
        self.seed(to_save)
        if replaces is None and self.store is not None and self.store.find(name) is not None:
            replaces = name  # a checkpoint of this step from before (a relaunch): this one takes its place
        if not self.ledger.admits(step, priority, replacing=replaces):
            return False
        states, trees = collected if collected is not None else collect()
        self.ledger.begin()
        gone = [e.filename for e in self.ledger.add(name, step, priority) if e.filename not in (name, replaces)]
        if replaces is not None and replaces != name:
            self.ledger.forget(replaces)
        about, mine = self.naming.metadata(to_save, priority), own() if own is not None else None  # after `add`
        self._write(Record(name, step, metrics, states, trees, about, mine, replaces, gone))
        self.saved = Saved.of(step, name, trees, _with(states, mine), metrics)
        if self.background and engine.last_event_name in _RUN_ENDS and outer is None:
            self.wait()  # the run ends here; a watcher added just now would not run in this firing
        return True

    def _write(self, record: Record) -> None:
        """Write ``record`` (a foreground save: and wait); a write that fails puts the ledger back."""
        try:
            with failures(self.on_error, self.ledger):
                self.to.write(record)
            if not self.background:
                self.wait()
        except BaseException:
            self.ledger.roll_back()
            raise

    def _watching(self, engine: Engine, outer: Engine | None) -> None:
        """Watch the engines a save fires on (added with ``add_event_handler``, Ignite's way, rather than attached)."""
        if self.store is None:
            return  # a save handler of yours: nothing to watch (see `watch`)
        for watched in (engine,) if outer is None else (engine, outer):
            if not watched.has_event_handler(self.finish, Events.COMPLETED):
                self.watch(watched)

    def best_on_disk(self) -> CheckpointInfo:
        """Once the save in flight is on disk: the best checkpoint kept (``save_now``'s answer), found in the store."""
        store = self.needs_store("save_now()")
        self.wait()
        best = self.ledger.best()
        if best is None:
            raise RuntimeError(f"No checkpoint could be written to {store.root}.")
        info = store.find(best.filename)
        if info is None:
            raise RuntimeError(
                f"The checkpoint {best.filename!r} is not in {store.root}, although it was just written."
            )
        return info

    def wait(self) -> CheckpointInfo | None:
        """The write in flight, once on disk (its error raised, or warned of); ``None`` if none."""
        info = None
        with failures(self.on_error, self.ledger):
            info = self.to.wait()
        self.ledger.settle()
        return info

    def resume(
        self, reader: Any, to_load: Mapping[str, Any], trees: Callable[[], dict[str, Any]]
    ) -> CheckpointInfo | None:
        """Restore ``to_load`` through ``reader`` (this store's latest by default); remember what was restored."""
        store = self.needs_store("resume()")
        reader = reader if reader is not None else CheckpointReader(store)
        if not isinstance(reader, CheckpointReader):
            raise TypeError(f"`reader` must be a CheckpointReader, got {type(reader).__name__}.")
        info = reader.load(to_load)
        if info is not None and store.holds(info):  # saving this step again amends it
            states = info.manifest.get("metadata", {}).get("state_dicts", {})
            self.saved = Saved.of(info.step, info.path.name, trees(), states, dict(info.metrics))
        return info

    def mine(self, to_save: Mapping[str, Any]) -> list[CheckpointInfo]:
        """This handler's valid checkpoints in the store, oldest first."""
        return [c for c in self.needs_store("latest_committed()").checkpoints() if self.naming.is_mine(c, to_save)]

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

    def needs_store(self, what: str) -> Store:
        """The store written to, or the ``TypeError`` saying that ``what`` (a method's name) needs one."""
        if self.store is None:
            raise TypeError(
                f"{what} reads ember's checkpoint store; this Checkpoint saves through your own save_handler. Load "
                "what it saved with Checkpoint.load_objects(to_load, checkpoint_dict)."
            )
        return self.store

    def check(self) -> None:
        """Every iteration: a failed background write surfaces at the next one."""
        try:
            self.to.check()
        except OSError as failed:  # the failure handling (raise, or warn) only when there is a failure
            with failures(self.on_error, self.ledger):
                raise failed

    def finish(self, engine: Engine) -> None:
        """At COMPLETED: the saves are on disk, and the destination has made them as safe as it makes any."""
        if engine.outer_engine is not None:
            return
        self.wait()
        with failures(self.on_error, self.ledger):
            self.to.finish()

    def watch(self, engine: Engine) -> None:
        """Surface background errors each iteration; finish writing at COMPLETED (after a save there).

        Only with a store: a save handler of yours writes on the training thread, so there is nothing to surface or
        finish, and nothing is added to the engine's iterations.
        """
        if self.store is None:
            return
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.check)
        engine.add_event_handler(Events.COMPLETED, self.finish)


def _with(states: dict[str, Any], own: dict[str, Any] | None) -> dict[str, Any]:
    """``states`` and, with ``include_self``, the handler's own state dict as ``"checkpointer"``."""
    return states if own is None else {**states, "checkpointer": own}


@dataclass
class Saved:
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
    ) -> Saved:
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
