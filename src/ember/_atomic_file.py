"""Files replaced atomically and made durable: what the checkpoint stores, the run's identity and its logs share.

Every layer may use it (it imports nothing of ember).
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from pathlib import Path

TMP_PREFIX = ".tmp-"


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


def fsync_path(path: Path) -> None:
    """Make a file's bytes, or a folder's entries (a rename, a new entry), durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(folder: Path, name: str, text: str | bytes) -> None:
    """Write ``folder/name`` anew with ``text`` (str or bytes): a temporary file, fsynced, renamed into place."""
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
