"""`NpySource`: records read from ``.npy`` files on disk as they are asked for, so a data set may exceed RAM."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ember.errors import RecordError


class NpySource:
    """A random-access source over ``.npy`` arrays on disk: ``source[i]`` is ``{name: array[i]}``.

    Nothing is loaded up front: each record is read from its file when asked for (one ``pread`` per array), so the data
    may be many times larger than memory and the process's resident memory stays flat over an epoch (the files' pages
    live in the operating system's cache, not in the process). It is Grain's random-access source protocol (``len`` and
    ``__getitem__``): pass it to [`GrainPipeline`][ember.data.GrainPipeline], or to ``grain.MapDataset.source`` and
    ``grain.DataLoader`` yourself. It pickles as its paths, so worker processes open the files themselves. A record that
    cannot be read raises [`RecordError`][ember.data.RecordError], naming its index.

    Args:
        paths: ``{name: path}`` of ``.npy`` files with the same length on axis 0, or a folder: every
            ``*.npy`` file in it, named by its stem (``x.npy`` gives ``"x"``).

    Examples:
        >>> import numpy as np, tempfile, os
        >>> from ember.data import NpySource
        >>> folder = tempfile.mkdtemp()
        >>> np.save(os.path.join(folder, "x.npy"), np.arange(12.0).reshape(6, 2))
        >>> np.save(os.path.join(folder, "y.npy"), np.arange(6))
        >>> source = NpySource(folder)
        >>> len(source), source[4]
        (6, {'x': array([8., 9.]), 'y': array(4)})
    """

    def __init__(self, paths: Mapping[str, str | os.PathLike[str]] | str | os.PathLike[str]) -> None:
        if isinstance(paths, str | os.PathLike):
            folder = Path(paths)
            if not folder.is_dir():
                raise ValueError(
                    f"`paths` must be a folder of .npy files or a mapping of names to them; got {str(folder)!r}."
                )
            paths = {p.stem: p for p in sorted(folder.glob("*.npy"))}
            if not paths:
                raise ValueError(f"`paths` names the folder {str(folder)!r}, which holds no .npy files.")
        if not isinstance(paths, Mapping) or not paths:
            raise ValueError(f"`paths` must be a non-empty mapping of names to .npy files; got {paths!r}.")
        self.paths = {str(k): Path(v) for k, v in paths.items()}
        self._layout = {name: _layout(name, path) for name, path in self.paths.items()}
        lengths = {name: shape[0] if shape else None for name, (shape, _, _) in self._layout.items()}
        if None in lengths.values() or len(set(lengths.values())) != 1:
            raise ValueError(f"Every array must have the same length on axis 0; got {lengths}.")
        self._len = int(next(iter(lengths.values())))  # type: ignore[arg-type]  # None refused above
        self._files: dict[str, int] | None = None  # open file descriptors, per process

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        if not 0 <= index < self._len:
            raise IndexError(f"record {index} is out of range for {self._len} records")
        if self._files is None:
            self._files = {name: os.open(path, os.O_RDONLY) for name, path in self.paths.items()}
        out = {}
        try:
            for name, (shape, dtype, offset) in self._layout.items():
                size = dtype.itemsize * math.prod(shape[1:])
                data = os.pread(self._files[name], size, offset + index * size)
                if len(data) != size:
                    raise OSError(f"{self.paths[name]} ended {size - len(data)} bytes early")
                out[name] = np.frombuffer(data, dtype).reshape(shape[1:])
        except Exception as e:
            raise RecordError(f"record {index} of {self!r} could not be read: {e!r}", index=index) from e
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_files": None}  # each process opens the files itself

    def __del__(self) -> None:
        for fd in (getattr(self, "_files", None) or {}).values():
            os.close(fd)

    def __repr__(self) -> str:  # stable across processes and runs: a resumed pipeline is checked by it
        files = ", ".join(f"{k}={str(p)!r}" for k, p in self.paths.items())
        return f"NpySource({files}, {self._len} records)"


def _layout(name: str, path: Path) -> tuple[tuple[int, ...], np.dtype[Any], int]:
    """``(shape, dtype, offset of the data)`` from a ``.npy`` file's header."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            offset = f.tell()
    except (OSError, ValueError) as e:
        raise ValueError(f"`paths[{name!r}]` = {str(path)!r} is not a readable .npy file: {e}") from e
    if fortran and len(shape) > 1:
        raise ValueError(f"`paths[{name!r}]` = {str(path)!r} is stored in Fortran order; save it C-ordered.")
    if dtype.hasobject:
        raise ValueError(f"`paths[{name!r}]` = {str(path)!r} holds Python objects; only plain arrays can be read.")
    return tuple(shape), dtype, offset
