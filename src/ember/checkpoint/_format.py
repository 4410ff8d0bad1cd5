"""The data file of a checkpoint: a msgpack stream written leaf by leaf, checksummed as it is written or read.

Layout: a header map ``{"format": 1, "leaves": n}``, then per leaf a list ``[path, kind, dtype, shape]``
followed by one msgpack ``bin`` holding the array's bytes (written straight from the array's memory, so no
second host copy of the tree is made) or, for Python scalars, the value itself.

The checksum is CRC-32 (``zlib.crc32``) of the whole file. It catches truncation and accidental
corruption, which is its job here, at about 4 GB/s on one core; computed on a helper thread beside the
file I/O, a save costs about as much as writing the bytes (SHA-256, at under 2 GB/s, did not keep up
with the disk: measurements in docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import sys
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import ml_dtypes  # noqa: F401  # pyright: ignore[reportUnusedImport]  # NumPy knows bfloat16 by name once imported
import msgpack
import numpy as np

FORMAT = 1
CHUNK = 64 << 20  # large arrays are written or read, and checksummed, in pieces of this size, side by side
_BIN32 = 0xC6


def _pack(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj)  # type: ignore[assignment]  # packb returns bytes without a stream
    return packed


def lower_thread_priority() -> None:
    """Make the calling thread yield the CPU to training: a background writer at nice +10 (Linux).

    On a machine whose cores the step itself uses (XLA:CPU), the writer's checksum and copies otherwise
    take CPU time from training; at a lower priority they use what training leaves. Elsewhere a no-op.
    """
    native_id = getattr(threading, "get_native_id", None)
    if sys.platform.startswith("linux") and native_id is not None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, native_id(), min(os.getpriority(os.PRIO_PROCESS, native_id()) + 10, 19))


class Checksum:
    """A running CRC-32 whose large updates run on a helper thread while the caller does I/O."""

    def __init__(self) -> None:
        self.value = 0
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="ember-crc32", initializer=lower_thread_priority
        )

    def overlapped(self, piece: memoryview, io: Any) -> Any:
        """Checksum ``piece`` while running ``io()``; return what ``io`` returned."""
        pending = self._pool.submit(zlib.crc32, piece, self.value)
        try:
            return io()
        finally:
            self.value = pending.result()

    def update(self, data: bytes | memoryview) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        self._pool.shutdown()
        return f"{self.value:08x}"


def write_leaves(f: IO[bytes], leaves: list[tuple[str, Any]]) -> tuple[int, str]:
    """Write ``(path, value)`` leaves; return the bytes written and their CRC-32 (hex)."""
    crc = Checksum()
    written = 0

    def put(chunk: bytes | memoryview) -> None:
        nonlocal written
        view = memoryview(chunk)
        for start in range(0, len(view), CHUNK):
            piece = view[start : start + CHUNK]
            if len(piece) < 1 << 20:
                f.write(piece)
                crc.update(piece)
            else:
                crc.overlapped(piece, lambda p=piece: f.write(p))
        written += len(view)

    put(_pack({"format": FORMAT, "leaves": len(leaves)}))
    for path, value in leaves:
        if isinstance(value, np.ndarray):
            array = value if value.flags.c_contiguous else np.ascontiguousarray(value)  # keeps 0-d arrays 0-d
            put(_pack([path, "array", dtype_text(array.dtype), list(array.shape)]))
            # as bytes: a view, no copy (ml_dtypes' arrays, bfloat16's, have no buffer of their own to cast); the
            # ignore below: a contiguous NumPy array exposes the buffer protocol
            data = memoryview(array.reshape(-1).view(np.uint8)) if array.size else memoryview(b"")  # type: ignore[arg-type]
            if len(data) >= 2**32:
                raise ValueError(f"Leaf {path!r} holds {len(data)} bytes; one leaf may hold at most 4 GiB.")
            put(bytes([_BIN32]) + struct.pack(">I", len(data)))
            put(data)
        else:
            put(_pack([path, "value", None, None]))
            put(_pack(value))
    return written, crc.hexdigest()


def dtype_text(dtype: np.dtype[Any]) -> str:
    """How the data file names ``dtype``: NumPy's code (``<f4``), or the name of one of JAX's extra dtypes.

    bfloat16 and the float8 types are NumPy "void" types to NumPy's codes (``<V2``), which would read back as raw
    bytes; their names (``bfloat16``) read back as themselves.

    Examples:
        >>> import ml_dtypes, numpy as np
        >>> from ember.checkpoint._format import dtype_text
        >>> dtype_text(np.dtype(np.float32)), dtype_text(np.dtype(ml_dtypes.bfloat16))
        ('<f4', 'bfloat16')
    """
    return dtype.name if dtype.kind == "V" and not dtype.name.startswith("void") else dtype.str


def read_file(f: io.BufferedIOBase) -> tuple[np.ndarray, str]:
    """The whole file in one buffer (read piece by piece, checksummed alongside), and its CRC-32.

    A file that shrinks while it is read gives a shorter buffer (its size no longer matches the manifest).
    """
    size = os.fstat(f.fileno()).st_size
    buf = np.empty(size, np.uint8)
    view = buf.data  # a writable memoryview of the buffer
    crc = Checksum()
    done, previous = 0, None
    while done < size:  # checksum the piece read last while reading the next one
        end = min(done + CHUNK, size)
        if previous is None:
            got = f.readinto(view[done:end])
        else:
            got = crc.overlapped(view[previous[0] : previous[1]], lambda a=done, b=end: f.readinto(view[a:b]))
        if not got:
            buf = buf[:done]
            break
        previous, done = (done, done + got), done + got
    if previous is not None:
        crc.update(view[previous[0] : previous[1]])
    return buf, crc.hexdigest()


def parse_leaves(buf: np.ndarray) -> dict[str, Any]:
    """The leaves of a data file read by `read_file`, by path (arrays are views of the one buffer)."""
    raw = buf.data
    pos = 0

    def next_object() -> Any:
        nonlocal pos
        unpacker = msgpack.Unpacker(raw=False, max_bin_len=0)
        unpacker.feed(raw[pos : pos + (1 << 16)])
        obj = unpacker.unpack()
        pos += unpacker.tell()
        return obj

    header = next_object()
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"not an ember checkpoint data file (header {header!r})")
    leaves: dict[str, Any] = {}
    for _ in range(int(header["leaves"])):
        path, kind, dtype, shape = next_object()
        if kind != "array":
            leaves[path] = next_object()
            continue
        if buf[pos] != _BIN32:
            raise ValueError(f"leaf {path!r} has no array data")
        (n,) = struct.unpack(">I", raw[pos + 1 : pos + 5])
        start, pos = pos + 5, pos + 5 + n
        if pos > len(buf):
            raise ValueError(f"leaf {path!r} runs past the end of the data file")
        leaves[path] = buf[start:pos].view(np.dtype(dtype)).reshape(shape)
    if pos != len(buf):
        raise ValueError("the data file holds more than its header announces")
    return leaves
