"""Files replaced atomically and made durable: what the checkpoint stores, the run's identity and its logs share.

Every layer may use it (it imports nothing of ember).
"""

from __future__ import annotations

import glob
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

TMP_PREFIX = ".tmp-"

#: A temporary of another machine is taken for abandoned once it is this many seconds old.
STALE_AFTER = 24 * 3600.0


def owner() -> str:
    """This process as a temporary folder's name says it: ``<host>.<pid>`` (the host without ``-`` or ``.``)."""
    return f"{re.sub(r'[^A-Za-z0-9_]', '_', socket.gethostname())}.{os.getpid()}"


def running(pid: int) -> bool:
    """Whether a process ``pid`` of this machine (and PID namespace) is running: a writer whose work may be in flight.

    Examples:
        >>> import os
        >>> from ember._atomic_file import running
        >>> running(os.getpid())
        True
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def temporary_name(name: str, writer: str | None = None, unique: int | None = None) -> str:
    """The name of a temporary folder for writing ``name``, owned by ``writer`` (this process by default).

    Its last part is random, or ``unique`` (in hex) where every process must arrive at the same name.
    """
    tail = f"{unique:08x}" if unique is not None else uuid.uuid4().hex[:8]
    return f"{TMP_PREFIX}{name}-{writer or owner()}-{tail}"


def abandoned(root: Path, name: str | None = None) -> Iterator[Path]:
    """The temporaries in ``root`` (of ``name``, or of any name) that no live writer will finish: safe to remove.

    A temporary's name ends with its owner and a random part (``.tmp-step_00000004-host.4242-1a2b3c4d``). It is
    abandoned when its owner is a process of this machine that no longer runs, when it names no owner (written
    before owners were named), or when it is older than `STALE_AFTER` (its owner on another machine). A write in
    flight, in this process or in another, is never touched.
    """
    here = owner().split(".")[0]
    for path in root.glob(f"{TMP_PREFIX}{'*' if name is None else glob.escape(name) + '-*'}"):
        found = re.search(r"-([A-Za-z0-9_]+)\.(\d+)-[0-9a-f]+$", path.name)
        if found is None:
            yield path
            continue
        host, pid = found.group(1), int(found.group(2))
        try:
            old = time.time() - path.stat().st_mtime > STALE_AFTER
        except FileNotFoundError:
            continue  # gone already: its writer committed or removed it
        if old or (host == here and not running(pid)):
            yield path


def fsync_path(path: Path) -> None:
    """Make a file's bytes, or a folder's entries (a rename, a new entry), durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(folder: Path, name: str, text: str | bytes) -> None:
    """Write ``folder/name`` anew with ``text`` (str or bytes): a temporary file, fsynced, renamed into place.

    A temporary of ``name`` that a killed writer left behind is removed first.
    """
    for leftover in abandoned(folder, name):
        leftover.unlink(missing_ok=True)
    tmp = folder / temporary_name(name)
    try:
        with open(tmp, "wb") as f:
            f.write(text.encode("utf-8") if isinstance(text, str) else text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(folder)
