"""`CheckpointInfo`: one verified checkpoint on disk, the order of checkpoints, and retention's checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


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


def newer(c: CheckpointInfo) -> tuple[int, float, str]:
    """The order of checkpoints in time: by step, then (two of one step: a resumed run saved it again) write time."""
    wall_time = c.manifest.get("wall_time")
    return c.step, wall_time if isinstance(wall_time, float) else 0.0, c.path.name


def preferred(found: list[CheckpointInfo], metric: str | None, mode: Literal["min", "max"]) -> list[CheckpointInfo]:
    """``found`` newest first, or (with ``metric``) those that carry it, best first; ties go to the later step."""
    newest_first = sorted(found, key=newer, reverse=True)
    if metric is None:
        return newest_first
    sign = 1.0 if mode == "max" else -1.0
    scored = [c for c in newest_first if metric in c.metrics]
    return sorted(scored, key=lambda c: (sign * c.metrics[metric], c.step), reverse=True)


def check_mode(mode: object) -> None:
    """Raise unless ``mode`` is "min" or "max"."""
    if mode not in ("min", "max"):
        raise ValueError(f"`mode` must be 'min' or 'max', got {mode!r}.")


def check_retention(keep_latest: object, keep_best: object, keep_every: object, mode: object) -> None:
    """Raise unless the counts are positive ints (or None) and ``mode`` is "min" or "max".

    [`CheckpointFolder.prune`][ember.checkpoint.CheckpointFolder.prune] checks its policies so; a handler that prunes
    later checks them when it is built, so a bad value fails before training starts.

    Examples:
        >>> from ember.checkpoint import check_retention
        >>> check_retention(keep_latest=0, keep_best=None, keep_every=None, mode="max")
        Traceback (most recent call last):
        ...
        ValueError: `keep_latest` must be a positive int or None, got 0.
    """
    for label, value in (("keep_latest", keep_latest), ("keep_best", keep_best), ("keep_every", keep_every)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"`{label}` must be a positive int or None, got {value!r}.")
    check_mode(mode)
