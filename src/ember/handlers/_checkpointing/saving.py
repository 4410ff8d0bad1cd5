"""`Saving`: a `Checkpoint`'s one save path, over one destination (a store of ember's, or a save handler of yours).

`Saved` is what it compares to tell whether a save repeats the last one: its step, states, score and arrays. A
`Destination` only writes a `Record` and, once it is saved, removes the checkpoints the record names as no longer
kept: `StoreDestination` adapts one of ember's stores (a folder per record, written and the old ones deleted on the
store's writer thread, amended in place when only its state dicts changed), `HandlerDestination` a save handler of
yours (Ignite's ``BaseSaveHandler``, or a function), called on the training thread with Ignite's dict of host values.
A foreground save is the same write followed by `Destination.wait`.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import jax
import numpy as np

from ember.checkpoint import CheckpointInfo
from ember.checkpoint._store import Store
from ember.engine import Engine, Events
from ember.handlers._checkpointing.checkpoint_names import Naming, Ranked, score_key
from ember.handlers._checkpointing.readers import CheckpointReader
from ember.handlers._checkpointing.retention import Ledger, failures
from ember.handlers._checkpointing.save_handlers import SaveHandler, takes_metadata
from ember.handlers._checkpointing.savers import DiskSaver

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


@dataclass
class Record:
    """One checkpoint to write: its name, step and score, the objects' state dicts and arrays, and what it replaces.

    ``own`` is the `Checkpoint`'s own state dict (``include_self``), kept apart from ``states`` because Ignite's dict
    adds it last; ``removes`` names the checkpoints retention no longer keeps once this one is saved; ``amend`` says
    that only the state dicts changed since the checkpoint ``name`` was written.
    """

    name: str
    step: int
    metrics: dict[str, float]
    states: dict[str, Any]
    trees: dict[str, Any]
    about: dict[str, Any]  # Ignite's metadata: basename, score_name, priority
    own: dict[str, Any] | None = None
    replaces: str | None = None
    removes: list[str] = field(default_factory=list[str])
    amend: bool = False


class Destination(Protocol):
    """What a `Checkpoint` writes through: write a record, then remove the checkpoints it supersedes.

    ``steps_once``: a step is written once here, so a save of the step written last amends it (or is skipped)
    instead of competing as a new checkpoint (ember's stores); without it every save is a new candidate, Ignite's
    rule for save handlers.
    """

    steps_once: bool

    def name(self, naming: Naming, to_save: Mapping[str, Any], rank: Ranked) -> str:
        """The name a new checkpoint gets here."""
        ...

    def write(self, record: Record) -> None:
        """Start writing ``record``; once it is saved, delete what ``record.removes`` names."""
        ...

    def wait(self) -> Any:
        """Block until the write in flight is on disk (raising its error); its info, or ``None``."""
        ...

    def check(self) -> None:
        """Raise the error of a write that already failed; never blocks."""
        ...

    def finish(self) -> None:
        """The run completes: make every write so far as safe as this destination makes any."""
        ...

    def path_of(self, name: str) -> Path | str:
        """Where checkpoint ``name`` is, as ``Checkpoint.last_checkpoint`` shows it."""
        ...


class StoreDestination:
    """One of ember's stores as a `Destination`: each record a folder, written on the store's writer thread."""

    steps_once = True

    def __init__(self, store: Store) -> None:
        self.store = store

    def name(self, naming: Naming, to_save: Mapping[str, Any], rank: Ranked) -> str:
        return naming.store_name(to_save, rank.step, rank.global_step, rank.priority, scored=bool(rank.metrics))

    def write(self, record: Record) -> None:
        states = record.states if record.own is None else {**record.states, "checkpointer": record.own}
        if record.amend:
            self.store.amend_in_background(record.name, metadata={"state_dicts": states})
            return
        metadata = {"state_dicts": states, "checkpoint": record.about}
        self.store.save_in_background(
            record.trees,
            step=record.step,
            metrics=record.metrics,
            metadata=metadata,
            name=record.name,
            replaces=record.replaces,
            removes=record.removes,  # deleted on the writer thread once this one is committed
        )

    def wait(self) -> Any:
        return self.store.wait()

    def check(self) -> None:
        self.store.raise_if_failed()

    def finish(self) -> None:
        self.store.finish()

    def path_of(self, name: str) -> Path:
        return self.store.path_of(name)


class HandlerDestination:
    """A save handler of yours as a `Destination`, Ignite's way: called now, on the training thread, by one process.

    The handler gets Ignite's checkpoint dict (host values; a single object's state as it is, the handler's own
    state added as ``"checkpointer"``) and Ignite's file name; its ``remove`` is called for a checkpoint no longer
    kept, after the new one was saved. Only process ``save_on_rank`` calls it.
    """

    steps_once = False

    def __init__(self, save_handler: Callable[..., Any], save_on_rank: int) -> None:
        self.save_handler: Any = save_handler  # a SaveHandler, or a plain function (which removes nothing)
        self.save_on_rank = save_on_rank
        self.with_metadata = takes_metadata(save_handler)

    def name(self, naming: Naming, to_save: Mapping[str, Any], rank: Ranked) -> str:
        return naming.ignite_name(to_save, rank.global_step, rank.priority)

    def write(self, record: Record) -> None:
        checkpoint: dict[str, Any] = checkpoint_dict(record.states, record.trees)
        if len(checkpoint) == 1:
            checkpoint = next(iter(checkpoint.values()))  # Ignite saves a single object's state as it is
        if record.own is not None:
            checkpoint["checkpointer"] = record.own
        if jax.process_index() != self.save_on_rank:  # (``steps_once`` is false: a record is never an amendment)
            return
        args = (checkpoint, record.name, record.about) if self.with_metadata else (checkpoint, record.name)
        self.save_handler(*args)
        for old in record.removes if isinstance(self.save_handler, SaveHandler) else ():
            self.save_handler.remove(old)

    def wait(self) -> None:
        return None  # every write was made on the training thread

    def check(self) -> None:
        return None

    def finish(self) -> None:
        return None

    def path_of(self, name: str) -> str:
        return name


def destination(save_handler: Any, save_on_rank: int) -> tuple[Any, Store | None, Destination]:
    """``save_handler`` as a `Checkpoint` keeps it, the store it writes to (``None`` for yours), and its destination."""
    if isinstance(save_handler, str | os.PathLike):
        save_handler = DiskSaver(save_handler, require_empty=False)
    store = save_handler.store if isinstance(save_handler, DiskSaver) else save_handler
    if isinstance(store, Store):
        return save_handler, store, StoreDestination(store)
    if save_handler is None:
        raise TypeError("`save_handler` is required: a folder, a CheckpointStore, a DiskSaver or a save handler.")
    if callable(save_handler):
        return save_handler, None, HandlerDestination(save_handler, save_on_rank)
    raise TypeError(
        "`save_handler` must be a folder, a CheckpointStore, a DiskSaver, or a callable "
        f"(checkpoint, filename, metadata) such as a BaseSaveHandler; got {type(save_handler).__name__}."
    )


def checkpoint_dict(states: dict[str, Any], trees: dict[str, Any]) -> dict[str, Any]:
    """The dict a user's save handler receives: each object's ``state_dict()``, a trainer's arrays on the host.

    An object with ``state_dict()`` only (an engine, a handler) gives its state dict; one with a tree (a trainer)
    gives ``{"state_dict": ..., "tree_state_dict": {path: numpy array}}``, which ``Checkpoint.load_objects`` takes
    back. Arrays are host copies made now, so the handler may keep them after the next step.
    """
    out: dict[str, Any] = dict(states)
    for name, tree in trees.items():
        host = {path: host_value(leaf) for path, leaf in tree.items()}
        out[name] = {"state_dict": out[name], "tree_state_dict": host} if name in out else {"tree_state_dict": host}
    return out


def host_value(leaf: Any) -> Any:
    """A NumPy copy of a device array (gathered from every process when it is sharded across them)."""
    if not isinstance(leaf, jax.Array):
        return leaf
    if not leaf.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
    return np.asarray(jax.device_get(leaf))
