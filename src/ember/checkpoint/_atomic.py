"""Atomic commit: write under a temporary name in the same folder, fsync, rename into place, fsync the folder.

Every change to a checkpoint folder is one rename (or one replace of its manifest), so a crash at any point leaves
each checkpoint either as it was or as it is meant to be, never half of one.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

TMP_PREFIX = ".tmp-"
REPLACING_SUFFIX = ".replacing"  # a checkpoint committed beside the one of the same name it replaces


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


def commit(tmp: Path, final: Path, *, replaces: Path | None = None) -> None:
    """Rename a fully written and fsynced folder into place, and make the rename durable.

    With ``replaces`` (an existing checkpoint's folder, which may be ``final`` itself), that checkpoint is removed
    once the new one is committed. When both have one name, the new one is committed beside it first (``final`` +
    ``.replacing``, a valid checkpoint of its own): a crash at any point leaves the old checkpoint, the new one, or
    both, and never neither.
    """
    fsync_dir(tmp)
    same = replaces is not None and replaces.absolute() == final.absolute()
    beside = final.with_name(final.name + REPLACING_SUFFIX)
    if same:
        remove(beside)  # left by a replacement that a crash interrupted; the checkpoint it replaced is `final`
    if same and final.exists():
        os.replace(tmp, beside)
        fsync_dir(final.parent)
        remove(final)
        os.replace(beside, final)
        fsync_dir(final.parent)
        return
    if final.exists():
        raise FileExistsError(f"A checkpoint named {final.name!r} already exists in {final.parent}.")
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if replaces is not None and not same:
        remove(replaces)


def remove(folder: Path) -> None:
    """Delete a checkpoint folder (renamed to a temporary name first, so a crash never leaves half of one)."""
    if not folder.exists():
        return
    doomed = folder.with_name(f"{TMP_PREFIX}deleting-{folder.name}-{uuid.uuid4().hex[:8]}")
    os.replace(folder, doomed)
    fsync_dir(folder.parent)
    shutil.rmtree(doomed)


def replace_file(folder: Path, name: str, text: str) -> None:
    """Write ``folder/name`` anew with ``text``: a temporary file, fsynced, renamed over it, the folder fsynced."""
    tmp = folder / f"{TMP_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(folder)
