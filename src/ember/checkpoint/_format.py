"""The data file of a checkpoint: a msgpack stream written leaf by leaf, hashed as it is written or read.

Layout: a header map ``{"format": 1, "leaves": n}``, then per leaf a list ``[path, kind, dtype, shape]``
followed by one msgpack ``bin`` holding the array's bytes (written straight from the array's memory, so no
second host copy of the tree is made) or, for Python scalars, the value itself.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from typing import IO, Any

import msgpack
import numpy as np

FORMAT = 1


class HashingReader:
    """A file wrapper that feeds everything read through SHA-256."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.sha = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self.sha.update(data)
        return data


def _pack(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj)  # type: ignore[assignment]  # packb returns bytes without a stream
    return packed


def _bin_header(n: int) -> bytes:
    return b"\xc6" + struct.pack(">I", n)  # msgpack bin 32


def write_leaves(f: IO[bytes], leaves: list[tuple[str, Any]]) -> tuple[int, str]:
    """Write ``(path, value)`` leaves; return the bytes written and their SHA-256."""
    sha = hashlib.sha256()
    written = 0

    def put(chunk: bytes | memoryview) -> None:
        nonlocal written
        f.write(chunk)
        sha.update(chunk)
        written += len(chunk)

    put(_pack({"format": FORMAT, "leaves": len(leaves)}))
    for path, value in leaves:
        if isinstance(value, np.ndarray):
            array = value if value.flags.c_contiguous else np.ascontiguousarray(value)  # keeps 0-d arrays 0-d
            put(_pack([path, "array", array.dtype.str, list(array.shape)]))
            data = memoryview(array).cast("B") if array.size else memoryview(b"")  # type: ignore[arg-type]
            if len(data) >= 2**32:
                raise ValueError(f"Leaf {path!r} holds {len(data)} bytes; one leaf may hold at most 4 GiB.")
            put(_bin_header(len(data)))
            put(data)
        else:
            put(_pack([path, "value", None, None]))
            put(_pack(value))
    return written, sha.hexdigest()


def read_leaves(f: IO[bytes]) -> tuple[dict[str, Any], str]:
    """Read a data file: the leaves by path, and the SHA-256 of everything read."""
    reader = HashingReader(f)
    unpacker = msgpack.Unpacker(reader, raw=False, max_bin_len=2**32 - 1, max_buffer_size=2**32)
    items: Iterator[Any] = iter(unpacker)
    header = next(items)
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"not an ember checkpoint data file (header {header!r})")
    leaves: dict[str, Any] = {}
    for _ in range(int(header["leaves"])):
        path, kind, dtype, shape = next(items)
        payload = next(items)
        leaves[path] = np.frombuffer(payload, dtype=np.dtype(dtype)).reshape(shape) if kind == "array" else payload
    if any(True for _ in items):
        raise ValueError("the data file holds more than its header announces")
    while reader.read(1 << 20):  # hash whatever the unpacker did not need to read
        pass
    return leaves, reader.sha.hexdigest()
