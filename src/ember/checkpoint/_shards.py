"""`ShardFormat`: one process's own shards of each array, in a folder of its own: a `TieredStore`'s fast tier.

Every process writes the shards its devices hold (each distinct shard once) into its own folder, without waiting for
the others, as a msgpack checkpoint with ember's atomic commit, manifest and CRC-32. A restore puts each shard back
on its device and builds the global arrays in the target's shardings; a shard the target needs that this process did
not save (another number of processes, another layout) makes the checkpoint unusable here, which is no damage: the
tiered store then reads the durable tier.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization, traverse_util

from ember.checkpoint._contract import Draft, Writers
from ember.checkpoint._format import detach, flat_leaves, on_host
from ember.checkpoint._manifest import CheckpointInfo, CorruptCheckpointError, check_structure, describe_tree
from ember.checkpoint._msgpack import DATA, check_data_file, parsed, read_data, write_data

SHARD = "#"  # separates a leaf's path from a shard's index in the data file: "params/w#0:4,0:8"


class NotHere(CorruptCheckpointError):
    """A fast checkpoint this process cannot give: gone, or intact but without the shards the target needs.

    Unusable here, so a restore goes on to the next checkpoint, as it does past a damaged one.
    """


@dataclass
class SaveCount:
    """A tiered store's count of saves since its durable tier's newest, which each fast save's manifest records."""

    since_durable: int = 0


class ShardFormat:
    """One process's shards of every array, in a msgpack data file of its own folder (a tiered store's fast tier).

    Every process saves, amends, prunes and sets aside in its own folder, with no collective. A restore asks
    ``agree`` for every process's verdict on the checkpoint (a `TieredStore` exchanges them), so every process
    reads it or none does; alone, its own verdict stands.
    """

    writers: Writers = "own"
    sharded = True

    def __init__(
        self,
        agree: Callable[[CheckpointInfo, BaseException | None], BaseException | None] | None = None,
        count: SaveCount | None = None,
    ) -> None:
        self.agree = agree if agree is not None else (lambda info, problem: problem)
        self.count = count if count is not None else SaveCount()
        self._pool: list[np.ndarray] = []  # host buffers reused from save to save (see detach)

    def prepare(self, draft: Draft, tree: Any, root: Path, *, background: bool) -> None:
        leaves = flat_leaves(tree)
        draft.manifest["layout"] = {
            "process": jax.process_index(),
            "processes": jax.process_count(),
            "tree": describe_tree(leaves),
            "since_durable": self.count.since_durable,
        }
        # a copy training cannot change (on the host): the write may run on the writer thread
        draft.leaves = detach(local_shards(leaves), self._pool)

    def write(self, draft: Draft, root: Path) -> dict[str, Any]:
        leaves = on_host(draft.leaves)
        draft.manifest["tree"] = describe_tree(leaves)
        return write_data(draft, root, leaves)

    def abandon(self, draft: Draft) -> None:
        return None

    def check_kind(self, path: Path, manifest: dict[str, Any]) -> None:
        check_data_file(manifest, "a TieredStore's fast tier")

    def read(self, info: CheckpointInfo, target: Any, on_verified: Callable[[], object] | None) -> Any:
        layout = info.manifest.get("layout")
        if not isinstance(layout, dict):
            raise ValueError(f"{info.path} was not written by a TieredStore's fast tier (its manifest has no layout).")
        wanted = flat_leaves(target) if target is not None else {}
        if target is not None:
            check_structure(layout["tree"], wanted)
        problem: BaseException | None = None
        makers: dict[str, Callable[[], Any]] = {}
        try:
            makers = rebuilders(layout["tree"], parsed(read_data(info), info.path / DATA), wanted)
        except (CorruptCheckpointError, OSError) as e:  # NotHere is one too
            problem = e
        problem = self.agree(info, problem)  # every process restores this checkpoint, or none does
        if problem is not None:
            raise problem
        if on_verified is not None:
            on_verified()
        leaves = {path: make() for path, make in makers.items()}
        nested = traverse_util.unflatten_dict(leaves, sep="/") if "" not in leaves else leaves[""]
        return nested if target is None else serialization.from_state_dict(target, nested)

    def close(self) -> None:
        return None


def local_shards(leaves: Mapping[str, Any]) -> dict[str, Any]:
    """``leaves`` with each device array replaced by the distinct shards this process holds, keyed ``path#index``."""
    out: dict[str, Any] = {}
    for path, leaf in leaves.items():
        if not isinstance(leaf, jax.Array):
            out[path] = leaf
            continue
        for shard in leaf.addressable_shards:
            out.setdefault(f"{path}{SHARD}{index_key(shard.index, leaf.shape)}", shard.data)
    return out


def index_key(index: tuple[Any, ...], shape: tuple[int, ...]) -> str:
    """A shard's index (a slice per dimension) as text: ``"0:4,0:8"``; ``""`` for a scalar."""
    return ",".join("{}:{}".format(*s.indices(n)[:2]) for s, n in zip(index, shape, strict=True))


def _slices(key: str) -> tuple[slice, ...]:
    return tuple(slice(*map(int, part.split(":"))) for part in key.split(",")) if key else ()


def rebuilders(
    layout: Mapping[str, Any], stored: Mapping[str, Any], wanted: Mapping[str, Any]
) -> dict[str, Callable[[], Any]]:
    """For each leaf of ``layout``, a function that builds it from ``stored`` (the data file's entries).

    A device array whose target (in ``wanted``) has a sharding is built on this process's devices; any other array is
    assembled whole on the host. Everything that can fail without touching a device (a shard missing) fails here,
    before any function is called, with `NotHere`.
    """
    shards: dict[str, dict[str, np.ndarray]] = {}
    for key, value in stored.items():
        path, sep, index = key.rpartition(SHARD)
        if sep:
            shards.setdefault(path, {})[index] = value
    makers: dict[str, Callable[[], Any]] = {}
    for path, entry in layout.items():
        if path not in shards:  # saved as it was: a NumPy array, a number, a string, an empty node
            value = stored.get(path)
            makers[path] = lambda value=value: value
            continue
        shape = tuple(entry["shape"])
        sharding = getattr(wanted.get(path), "sharding", None)
        if sharding is not None:
            makers[path] = _on_devices(path, shape, sharding, shards[path])
        else:
            whole = _whole(path, shape, shards[path])
            makers[path] = lambda whole=whole: whole
    return makers


def _on_devices(path: str, shape: tuple[int, ...], sharding: Any, held: dict[str, np.ndarray]) -> Callable[[], Any]:
    pieces = []
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        key = index_key(index, shape)
        if key not in held:
            raise NotHere(f"this process saved no shard [{key}] of {path!r} (it saved {sorted(held)})")
        pieces.append((device, held[key]))

    def make() -> jax.Array:
        arrays = [jax.device_put(piece, device) for device, piece in pieces]
        return jax.make_array_from_single_device_arrays(shape, sharding, arrays)

    return make


def _whole(path: str, shape: tuple[int, ...], held: dict[str, np.ndarray]) -> np.ndarray:
    first = next(iter(held.values()))
    whole = np.empty(shape, first.dtype)
    covered = 0
    for key, piece in held.items():
        whole[_slices(key)] = piece
        covered += piece.size
    if covered != whole.size:
        raise NotHere(f"this process holds {covered} of the {whole.size} elements of {path!r}")
    return whole


def verdict(problem: BaseException | None) -> str:
    """A process's verdict on a restore, as text for the others: ``"null"``, or the error's kind and message."""
    return json.dumps(None if problem is None else [type(problem).__name__, str(problem)])
