"""Where a `Checkpoint`'s records go: one contract (write a record, then remove what it supersedes).

A `Checkpoint` decides what to save and what retention pushes out (`saving.Saving`); a `Destination` only writes a
`Record` and, once it is saved, removes the checkpoints the record names as no longer kept. One of ember's stores is
adapted to it by `StoreDestination` (a folder per record, written and the old ones deleted on the store's writer
thread, amended in place when only its state dicts changed); a save handler of yours (Ignite's ``BaseSaveHandler``,
or a function) by `HandlerDestination`, which calls it on the training thread with Ignite's dict of host values. A
foreground save is the same write followed by `Destination.wait`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import jax
import numpy as np

from ember.checkpoint._store import Store
from ember.handlers._checkpointing.checkpoint_names import Naming, Ranked
from ember.handlers._checkpointing.save_handlers import SaveHandler, takes_metadata
from ember.handlers._checkpointing.savers import DiskSaver


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
        if self.store.writing:
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
