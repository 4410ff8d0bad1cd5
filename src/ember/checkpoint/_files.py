"""The files of a checkpoint: each one's size and CRC-32, recorded at commit and checked before a restore.

A record is ``{relative path: {"bytes": n, "crc32": "8 hex digits"}}``. Checking sizes costs one ``stat`` per file
(every listing does it); checking checksums reads every byte once (a restore, ``ember inspect``), at the speed of
the disk: CRC-32 runs at about 4 GB/s on one core, on a helper thread beside the reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ember._atomic_file import fsync_path
from ember.checkpoint._format import Checksum

#: Bytes read and checksummed at a time: large enough that a piece costs nothing to hand over, small enough that the
#: two buffers cost little to make (64 MB ones took a third of the time on a 256 MB file).
PIECE = 8 << 20


def list_files(folder: Path) -> list[str]:
    """Every file below ``folder``, as sorted paths relative to it (``/``-separated)."""
    found = []
    for dirpath, _, names in os.walk(folder):
        base = Path(dirpath).relative_to(folder)
        found += [(base / name).as_posix() for name in names]
    return sorted(found)


def crc32_of(path: Path, *, durable: bool = False) -> tuple[int, str]:
    """``(bytes, CRC-32 as hex)`` of one file, read in pieces with the checksum of each beside the next read.

    Two buffers of `PIECE` bytes take turns: one is read into while the other is checksummed on a helper thread.
    With ``durable``, the file is fsynced too (its bytes on disk, not only in the page cache).
    """
    crc = Checksum()
    size = os.path.getsize(path)
    if size == 0:
        if durable:
            fsync_path(path)
        return 0, crc.hexdigest()
    buffers = [memoryview(bytearray(min(PIECE, size))) for _ in range(2 if size > PIECE else 1)]
    done = 0
    with open(path, "rb", buffering=0) as f:
        got = f.readinto(buffers[0])
        turn = 0
        while got:
            filled = buffers[turn][:got]
            done += got
            nxt = buffers[(turn + 1) % len(buffers)]
            got = crc.overlapped(filled, lambda b=nxt: f.readinto(b)) if done < size else (crc.update(filled) or 0)
            turn = (turn + 1) % len(buffers)
        if durable:
            os.fsync(f.fileno())
    return done, crc.hexdigest()


def record(folder: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The records of ``names`` (relative to ``folder``), reading each file once; each file and folder made durable.

    Another program wrote the files (orbax, through tensorstore) and nothing says it fsynced them: each is fsynced as
    it is checksummed, and so is every folder holding one, before the manifest that records them is written.
    """
    out = {}
    for name in names:
        size, crc = crc32_of(folder / name, durable=True)
        out[name] = {"bytes": size, "crc32": crc}
    for parent in sorted({(folder / name).parent for name in out}):
        fsync_path(parent)
    return out


def size_problem(folder: Path, records: Mapping[str, Mapping[str, Any]]) -> tuple[str, str] | None:
    """``(file, why)`` for the first recorded file that is missing or has another size; ``None`` if all match."""
    for name, expected in records.items():
        try:
            size = (folder / name).stat().st_size
        except FileNotFoundError:
            return name, "is missing"
        if size != expected["bytes"]:
            return name, wrong_size(size, expected["bytes"])
    return None


def wrong_size(size: int, expected: int) -> str:
    """Why a file of ``size`` bytes is not the one of ``expected`` bytes the manifest recorded."""
    return f"holds {size} bytes, the manifest says {expected} ({'truncated' if size < expected else 'it grew'})"


def checksum_problem(folder: Path, records: Mapping[str, Mapping[str, Any]]) -> tuple[str, str] | None:
    """``(file, why)`` for the first of ``records`` whose bytes do not match its CRC-32; ``None`` if all match."""
    for name, expected in records.items():
        try:
            size, crc = crc32_of(folder / name)
        except FileNotFoundError:
            return name, "is missing"
        if size != expected["bytes"]:
            return name, wrong_size(size, expected["bytes"])
        if crc != expected["crc32"]:
            return name, "does not match its CRC-32 in the manifest (it was changed or damaged on disk)"
    return None
