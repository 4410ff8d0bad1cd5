"""`CheckpointInfo`: one verified checkpoint on disk, and the file records its manifest keeps."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
