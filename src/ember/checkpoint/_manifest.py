"""A checkpoint's manifest (what it holds, written last, checked with a checksum of its own) and `CheckpointInfo`."""

from __future__ import annotations

import base64
import json
import os
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ember._atomic_file import replace_file
from ember._version import __version__
from ember.errors import CorruptCheckpointError

MANIFEST = "manifest.json"
FORMAT = 2  # 2: the manifest carries its own checksum; 1 (read only): it does not


@dataclass(frozen=True)
class CheckpointInfo:
    """One verified checkpoint on disk: its folder, step, metrics and manifest.

    Examples:
        >>> import tempfile, numpy as np
        >>> from ember.checkpoint import CheckpointStore
        >>> store = CheckpointStore(tempfile.mkdtemp())
        >>> info = store.save({"w": np.ones(2)}, step=7, metrics={"loss": 0.5})
        >>> info.step, info.metrics, info.path.name
        (7, {'loss': 0.5}, 'step_00000007')
        >>> repr(info).replace(str(info.path.parent), "...")  # short: the manifest is left out
        "CheckpointInfo(path=PosixPath('.../step_00000007'), step=7, metrics={'loss': 0.5})"
    """

    path: Path
    step: int
    metrics: dict[str, float]
    manifest: dict[str, Any] = field(repr=False)  # printed, it would fill a screen: its path and step say which

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        """The files the manifest records with their size and CRC-32: ``{relative path: {"bytes", "crc32"}}``.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> info = CheckpointStore(tempfile.mkdtemp()).save({"w": np.ones(2)}, step=1)
            >>> list(info.files), info.files["state.msgpack"]["bytes"] > 16
            (['state.msgpack'], True)
        """
        return file_records(self.manifest)


def file_records(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The manifest's records of the files it lists with a size (and CRC-32): ``{relative path: record}``."""
    files = manifest["files"]
    return {name: f for name, f in files.items() if isinstance(f, dict) and isinstance(f.get("bytes"), int)}


def describe(leaf: Any) -> dict[str, Any]:
    """A leaf's entry in the manifest's tree: shape and dtype of an array (or an abstract one), else the type name."""
    if isinstance(leaf, np.ndarray | jax.Array | jax.ShapeDtypeStruct):
        return {"shape": list(leaf.shape), "dtype": np.dtype(leaf.dtype).name}
    return {"value": type(leaf).__name__}


def new_manifest(
    step: int,
    metrics: Mapping[str, float] | None,
    metadata: Mapping[str, Any] | None,
    leaves: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A checkpoint's manifest, less its ``files`` and checksum; fails here, in the caller's thread, if not JSON.

    Without ``leaves`` it has no ``tree`` yet: `write_manifest` describes the leaves on the writer thread.
    """
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "step": step,
        "wall_time": time.time(),
        "ember_version": __version__,
        "metrics": {k: float(v) for k, v in (metrics or {}).items()},
        "metadata": _encode_bytes(dict(metadata or {})),
    }
    json.dumps(manifest)
    if leaves is not None:
        manifest["tree"] = describe_tree(leaves)
    return manifest


def describe_tree(leaves: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's ``tree``: each leaf's path with its `describe` entry."""
    return {path: describe(leaf) for path, leaf in leaves.items()}


_BYTES = "$bytes"  # a bytes value in the manifest, base64: {"$bytes": "..."} (Grain's DataLoader state is bytes)


def _encode_bytes(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return {_BYTES: base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, Mapping):
        return {k: _encode_bytes(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_encode_bytes(v) for v in obj]
    return obj


def _decode_bytes(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and isinstance(obj.get(_BYTES), str):
        return base64.b64decode(obj[_BYTES])
    return obj


def _checksum(manifest: Mapping[str, Any]) -> int:
    """CRC-32 of the manifest (bytes values in their ``$bytes`` form), less its checksum, as canonical JSON."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """Add the manifest's own checksum and write it into ``folder``, fsynced (one line: JSON's C encoder)."""
    with open(folder / MANIFEST, "w") as f:
        f.write(manifest_text(manifest))
        f.flush()
        os.fsync(f.fileno())


def manifest_text(manifest: dict[str, Any]) -> str:
    """The manifest as written: its own checksum added (in place), as one line of JSON."""
    manifest.pop("checksum", None)
    manifest["checksum"] = _checksum(manifest)
    return json.dumps(manifest)


def amended(
    manifest: dict[str, Any], metrics: Mapping[str, float] | None, metadata: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A read manifest with new ``metrics`` and ``metadata`` (where given), ready for `manifest_text`."""
    changed = new_manifest(manifest["step"], metrics, metadata)
    out = {k: _encode_bytes(v) for k, v in manifest.items() if k != "checksum"}
    if metrics is not None:
        out["metrics"] = changed["metrics"]
    if metadata is not None:
        out["metadata"] = changed["metadata"]
    return out


def read_manifest(folder: Path) -> dict[str, Any]:
    """The verified manifest of the checkpoint in ``folder``.

    Raises:
        FileNotFoundError: there is no manifest (not a checkpoint, or one whose write never finished).
        CorruptCheckpointError: the manifest is not valid JSON, fails its checksum, or lacks a field.
    """
    path = folder / MANIFEST
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{folder} has no {MANIFEST}") from None
    try:
        stored = json.loads(text)  # as written: bytes values in their $bytes form, which the checksum covers
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError both
        raise corrupt(folder, MANIFEST, f"is not valid JSON ({e})") from None
    if not isinstance(stored, dict):
        raise corrupt(folder, MANIFEST, f"holds a {type(stored).__name__}, not an object")
    if "checksum" in stored:
        if stored["checksum"] != _checksum(stored):
            raise corrupt(folder, MANIFEST, "does not match its own checksum (it was changed or damaged on disk)")
    elif stored.get("format") != 1:  # only manifests written before checksums may lack one
        raise corrupt(folder, MANIFEST, "has no checksum")
    manifest = json.loads(text, object_hook=_decode_bytes)
    for key, kind in (("step", int), ("metrics", dict), ("tree", dict), ("files", dict)):
        if not isinstance(manifest.get(key), kind):
            raise corrupt(folder, MANIFEST, f"has no valid {key!r} field")
    return manifest


def corrupt(folder: Path, file: str, why: str) -> CorruptCheckpointError:
    """The error for a checkpoint whose ``file`` is at fault, naming both."""
    return CorruptCheckpointError(f"Checkpoint {str(folder)!r} is corrupt: its {file} {why}.")


def check_structure(saved: dict[str, Any], target: dict[str, Any]) -> None:
    """Raise ``ValueError`` listing every path, shape and dtype where ``target`` differs from ``saved``."""
    problems = [f"missing from the checkpoint: {p}" for p in sorted(set(target) - set(saved))]
    problems += [f"not in the target: {p}" for p in sorted(set(saved) - set(target))]
    for path in sorted(set(saved) & set(target)):
        want, got = describe(target[path]), saved[path]
        if want != got:
            problems.append(f"{path}: the checkpoint has {_fmt(got)}, the target {_fmt(want)}")
    if problems:
        shown = "\n  ".join(problems[:20]) + ("\n  ..." if len(problems) > 20 else "")
        raise ValueError(f"The checkpoint does not fit the target ({len(problems)} differences):\n  {shown}")


def _fmt(d: dict[str, Any]) -> str:
    return f"{d['dtype']}{d['shape']}" if "shape" in d else d["value"]


class WrongStoreError(ValueError):
    """A checkpoint written by another kind of store (msgpack's ``CheckpointStore``, ``OrbaxStore``) than the reader."""


def wrong_store(manifest: dict[str, Any], reader: str) -> WrongStoreError:
    """The error for a store (``reader``) asked to read a checkpoint another kind of store wrote."""
    files = manifest["files"]
    writer = "OrbaxStore" if "state" in files else "CheckpointStore" if "state.msgpack" in files else "another store"
    return WrongStoreError(
        f"it was written by {writer} (its manifest lists the files {sorted(files)}), and {reader} cannot read it; "
        f"open the folder with {writer} (ember.checkpoint.open_store picks it)"
    )


def amend_manifest(
    path: Path, metrics: Mapping[str, float] | None, metadata: Mapping[str, Any] | None
) -> CheckpointInfo:
    """Replace the metrics or the metadata (those given) of the checkpoint in ``path``; its arrays stay as they are.

    Only the manifest is written again, atomically: a temporary file, fsynced, renamed over it.
    """
    manifest = amended(read_manifest(path), metrics, metadata)
    replace_file(path, MANIFEST, manifest_text(manifest))
    return CheckpointInfo(path, manifest["step"], manifest["metrics"], manifest)
