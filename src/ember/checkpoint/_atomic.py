"""Atomic commit: write under a temporary name in the same folder, fsync, rename into place, fsync the folder."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

TMP_PREFIX = ".tmp-"


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temporary_dir(root: Path, name: str) -> Path:
    """A new folder in ``root`` for writing ``name``; created with the permissions the umask allows."""
    tmp = root / f"{TMP_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()  # not tempfile.mkdtemp: that would force 0700 whatever the umask (Ignite #1876)
    return tmp


def commit(tmp: Path, final: Path) -> None:
    """Rename a fully written and fsynced folder into place, and make the rename durable."""
    fsync_dir(tmp)
    if final.exists():
        raise FileExistsError(f"A checkpoint named {final.name!r} already exists in {final.parent}.")
    os.replace(tmp, final)
    fsync_dir(final.parent)
