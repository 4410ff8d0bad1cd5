"""Atomic commit: write under a temporary name in the same folder, fsync, rename into place, fsync the folder.

Every change to a checkpoint folder is one rename (or one replace of its manifest), so a crash at any point leaves
each checkpoint either as it was or as it is meant to be, never half of one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ember._atomic_file import fsync_path, temporary_name

REPLACING_SUFFIX = ".replacing"  # a checkpoint committed beside the one of the same name it replaces


def temporary_dir(root: Path, name: str) -> Path:
    """A new folder in ``root`` for writing ``name``; created with the permissions the umask allows."""
    tmp = root / temporary_name(name)
    tmp.mkdir()  # not tempfile.mkdtemp: that would force 0700 whatever the umask (Ignite #1876)
    return tmp


def commit(tmp: Path, final: Path, *, replaces: Path | None = None) -> None:
    """Rename a fully written and fsynced folder into place, and make the rename durable.

    With ``replaces`` (an existing checkpoint's folder, which may be ``final`` itself), that checkpoint is removed
    once the new one is committed. When both have one name, the new one is committed beside it first (``final`` +
    ``.replacing``, a valid checkpoint of its own): a crash at any point leaves the old checkpoint, the new one, or
    both, and never neither.
    """
    fsync_path(tmp)
    same = replaces is not None and replaces.absolute() == final.absolute()
    beside = final.with_name(final.name + REPLACING_SUFFIX)
    if same:
        remove(beside)  # left by a replacement that a crash interrupted; the checkpoint it replaced is `final`
    if same and final.exists():
        os.replace(tmp, beside)
        fsync_path(final.parent)
        remove(final)
        os.replace(beside, final)
        fsync_path(final.parent)
        return
    if final.exists():
        raise FileExistsError(f"A checkpoint named {final.name!r} already exists in {final.parent}.")
    os.replace(tmp, final)
    fsync_path(final.parent)
    if replaces is not None and not same:
        remove(replaces)


def remove(folder: Path) -> None:
    """Delete a checkpoint folder (renamed to a temporary name first, so a crash never leaves half of one)."""
    if not folder.exists():
        return
    doomed = folder.with_name(temporary_name(f"deleting-{folder.name}"))
    try:
        os.replace(folder, doomed)
    except FileNotFoundError:  # another process removed it first (two watchers ending together)
        return
    fsync_path(folder.parent)
    shutil.rmtree(doomed)
