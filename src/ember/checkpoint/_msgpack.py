"""`MsgpackFormat`: the native format, one ``state.msgpack`` data file per checkpoint, written by process 0."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flax import serialization, traverse_util

from ember.checkpoint._atomic import temporary_dir
from ember.checkpoint._contract import Draft, Writers
from ember.checkpoint._format import detach, flat_leaves, on_host, parse_leaves, read_file, write_leaves, wrong_size
from ember.checkpoint._manifest import MANIFEST, CheckpointInfo, check_structure, corrupt, describe_tree, wrong_store

DATA = "state.msgpack"


class MsgpackFormat:
    """The whole tree in one msgpack stream (``state.msgpack``), with its size and CRC-32 in the manifest.

    Process 0 writes it (every array must be readable whole there). A background save's tree is copied first,
    into host buffers reused from one save to the next, or, with ``device_snapshot``, on the device (see
    [`CheckpointStore`][ember.checkpoint.CheckpointStore]).
    """

    writers: Writers = "primary"
    sharded = False

    def __init__(self, *, device_snapshot: bool = False) -> None:
        self.device_snapshot = device_snapshot
        self._pool: list[np.ndarray] = []  # the host buffers background saves copy into (see detach)

    def prepare(self, draft: Draft, tree: Any, root: Path, *, background: bool) -> None:
        if background:
            tree = detach(tree, self._pool, on_device=self.device_snapshot)
        draft.leaves = flat_leaves(tree)

    def write(self, draft: Draft, root: Path) -> dict[str, Any]:
        leaves = on_host(draft.leaves)  # device snapshots (or, saving in the foreground, the state) come over here
        draft.manifest["tree"] = describe_tree(leaves)
        return write_data(draft, root, leaves)

    def abandon(self, draft: Draft) -> None:
        return None  # nothing runs besides the writer thread

    def check_kind(self, path: Path, manifest: dict[str, Any]) -> None:
        check_data_file(manifest, "CheckpointStore")

    def read(self, info: CheckpointInfo, target: Any, on_verified: Callable[[], object] | None) -> Any:
        if target is not None:
            check_structure(info.manifest["tree"], flat_leaves(target))
        buf = read_data(info)
        if on_verified is not None:
            on_verified()
        leaves = parsed(buf, info.path / DATA)
        nested = traverse_util.unflatten_dict(leaves, sep="/") if "" not in leaves else leaves[""]
        return nested if target is None else serialization.from_state_dict(target, nested)

    def close(self) -> None:
        return None


def check_data_file(manifest: dict[str, Any], reader: str) -> None:
    """Raise ``WrongStoreError`` unless the manifest records a data file of this format (``reader`` reads it)."""
    expected = manifest["files"].get(DATA)
    if not isinstance(expected, dict) or not isinstance(expected.get("bytes"), int):
        raise wrong_store(manifest, reader)


def write_data(draft: Draft, root: Path, leaves: dict[str, Any]) -> dict[str, Any]:
    """Write ``leaves`` as the data file of a new temporary folder (``draft.tmp``), fsynced; return its record."""
    draft.tmp = temporary_dir(root, draft.name)
    with open(draft.tmp / DATA, "wb") as f:
        size, crc = write_leaves(f, list(leaves.items()))
        f.flush()
        os.fsync(f.fileno())
    return {DATA: {"bytes": size, "crc32": crc}}


def read_data(info: CheckpointInfo) -> np.ndarray:
    """The bytes of the checkpoint's data file, once their size and CRC-32 match the manifest."""
    try:
        with open(info.path / DATA, "rb") as f:
            buf, crc = read_file(f)
    except FileNotFoundError:
        raise corrupt(info.path, DATA, "is missing") from None
    if len(buf) != info.manifest["files"][DATA]["bytes"]:
        raise corrupt(info.path, DATA, wrong_size(len(buf), info.manifest["files"][DATA]["bytes"]))
    if crc != info.manifest["files"][DATA].get("crc32"):
        raise corrupt(info.path, DATA, f"does not match the checksum in {MANIFEST}")
    return buf


def parsed(buf: np.ndarray, path: Path) -> dict[str, Any]:
    """The leaves in ``buf`` (read from ``path``, intact); a ``ValueError`` saying so if they do not parse."""
    try:
        return parse_leaves(buf)
    except Exception as e:  # intact bytes that do not parse: not damage, so nothing is moved aside
        raise ValueError(
            f"{path} matches its checksum but cannot be parsed ({type(e).__name__}: {e}); was it "
            "written by another version of ember?"
        ) from e
