"""The data files of a checkpoint: the tree taken out of training's reach, streamed leaf by leaf, checksummed.

What a save writes is the tree flattened to ``{path: leaf}``, checked, and copied out of training's reach
(`flat_leaves`, `detach`); the files' sizes and CRC-32s are recorded at commit and checked before a restore
(`record`, `size_problem`, `checksum_problem`: one ``stat`` per file on every listing; every byte read once on a
restore, at the speed of the disk).

The msgpack stream:

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
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  # pyright: ignore[reportUnusedImport]  # NumPy knows bfloat16 by name once imported
import msgpack
import numpy as np
from flax import serialization, traverse_util

from ember._atomic_file import fsync_path

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


def flat_leaves(tree: Any) -> dict[str, Any]:
    """``tree`` as ``{"a/b/c": leaf}``, leaves as they are (device arrays stay on device); checks leaf types."""
    state = serialization.to_state_dict(tree)
    flat = traverse_util.flatten_dict(state, sep="/", keep_empty_nodes=True) if isinstance(state, dict) else {"": state}
    out: dict[str, Any] = {}
    for path, leaf in flat.items():
        if leaf is traverse_util.empty_node:  # an empty subtree, such as optax's EmptyState()
            out[path] = {}
        elif (
            isinstance(leaf, np.ndarray | np.generic | jax.Array | jax.ShapeDtypeStruct)
            or leaf is None
            or isinstance(leaf, bool | int | float | str)
        ):
            out[path] = leaf
        else:
            raise TypeError(f"Checkpoint leaf {path!r} is a {type(leaf).__name__}; leaves must be arrays or scalars.")
    return out


def on_host(leaves: dict[str, Any]) -> dict[str, Any]:
    """``leaves`` with device arrays fetched (all transfers started at once) and arrays as NumPy."""
    fetched = jax.device_get(leaves)
    return {k: np.asarray(v) if isinstance(v, np.ndarray | np.generic) else v for k, v in fetched.items()}


def check_gatherable(tree: Any) -> None:
    """Raise unless every array can be read whole on this process (addressable here, or replicated)."""
    for path, x in jax.tree_util.tree_leaves_with_path(tree):
        if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
            raise ValueError(
                f"Checkpoint leaf {jax.tree_util.keystr(path)} is sharded across processes; this process cannot "
                "read it whole. Save sharded state with ember.checkpoint.OrbaxStore, where each process writes "
                "its own shards."
            )


def detach(tree: Any, pool: list[np.ndarray], *, on_device: bool = False) -> Any:
    """``tree`` in memory of its own, that training cannot change: what a background save writes.

    Arrays on an accelerator are copied to the host (``on_device=False``; every transfer is started at
    once), or copied on the device by one compiled call that returns at once (``on_device=True``); the
    writer thread then fetches the copies while training goes on. Arrays on the CPU backend and NumPy
    arrays are copied into ``pool``'s buffers: ``jax.device_get`` returns views of CPU device buffers, and a
    view would let the next training step, which donates the state, either overwrite what is being saved
    or (as XLA:CPU does) wait until the write lets go of the buffer. The buffers are reused from one save
    to the next (the previous write is finished by then): allocating a gigabyte of fresh pages each save
    costs more than copying into it.
    """
    leaves, treedef = jax.tree.flatten(tree)
    in_host_memory = [isinstance(x, np.ndarray) or (isinstance(x, jax.Array) and _on_cpu(x)) for x in leaves]
    remote = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and not in_host_memory[i]]
    if remote:
        picked = [leaves[i] for i in remote]
        for i, copy in zip(remote, _copy_on_device(picked) if on_device else jax.device_get(picked), strict=True):
            leaves[i] = copy
    local = [i for i, here in enumerate(in_host_memory) if here]
    for slot, i in enumerate(local):
        x = np.asarray(leaves[i])
        if slot >= len(pool):
            pool.append(np.empty(x.shape, x.dtype))
        elif pool[slot].shape != x.shape or pool[slot].dtype != x.dtype:
            pool[slot] = np.empty(x.shape, x.dtype)
        np.copyto(pool[slot], x)
        leaves[i] = pool[slot]
    return jax.tree.unflatten(treedef, leaves)


def _on_cpu(x: jax.Array) -> bool:
    return all(d.platform == "cpu" for d in x.devices())


@jax.jit
def _copy_on_device(arrays: list[jax.Array]) -> list[jax.Array]:
    """New device buffers holding the same values (inputs are not donated, so XLA cannot alias them)."""
    return [jnp.copy(x) for x in arrays]
