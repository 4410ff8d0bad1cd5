"""`JsonlWriter` and `CsvWriter`: records as lines of plain files, readable without ember."""

from __future__ import annotations

import csv
import json
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from ember._atomic_file import fsync_path, replace_file
from ember.writers._writer import Writer


def writable_folder(folder: str | os.PathLike[str], argument: str, writer: str) -> Path:
    """``folder``, made if missing, once a file could be written in it; else an ``OSError`` saying which and why.

    A log that cannot be written fails where it is set up, not on the writer thread at the first record.

    Examples:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from ember.writers._files import writable_folder
        >>> not_a_folder = Path(tempfile.mkdtemp()) / "file"
        >>> _ = not_a_folder.write_text("")
        >>> writable_folder(not_a_folder / "logs", "logdir", "TensorBoardWriter")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        OSError: TensorBoardWriter cannot write in `logdir` .../file/logs: [Errno 20] Not a directory: ...
    """
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as e:
        message = f"{writer} cannot write in `{argument}` {path}: {e}. Give a folder it can create files in."
        raise OSError(message) from e
    return path


class _FileWriter(Writer):
    _header = False  # the file's first line is a header, kept by resume_at

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise IsADirectoryError(f"{type(self).__name__}: `path` {self.path} is a folder; give the log file's path.")
        writable_folder(self.path.parent, "path", type(self).__name__)
        self._file: TextIO | None = None
        self._synced = False  # whether the folder's entry for the file was fsynced

    def _open(self) -> TextIO:
        if self._file is None:
            self._file = self.path.open("a", encoding="utf-8", newline="")
        return self._file

    def _keep(self, line: str, step: int) -> bool:
        raise NotImplementedError

    def resume_at(self, step: int) -> None:
        """Rewrite the file without the records of steps after ``step``; the next record reopens it for appending.

        A last line without its line end (a write a kill cut off) is dropped whole. A new file is written beside the
        old one and renamed over it, so a crash leaves the old file or the new one, whole.
        """
        if not self.path.exists():
            return
        self.close()
        lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
        whole = lines if not lines or lines[-1].endswith("\n") else lines[:-1]
        kept = [line for i, line in enumerate(whole) if (i == 0 and self._header) or self._keep(line, step)]
        if len(kept) == len(lines):
            return
        replace_file(self.path.parent, self.path.name, "".join(kept))

    def flush(self) -> None:
        """Hand what was written to the operating system: a killed process loses none of it."""
        if self._file is not None:
            self._file.flush()

    def sync(self) -> None:
        """Flush and fsync the file (and, the first time, its folder's entry for it): a power loss loses none of it."""
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            if not self._synced:
                fsync_path(self.path.parent)
                self._synced = True

    def close(self) -> None:
        """Flush, fsync and close the file."""
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None


class JsonlWriter(_FileWriter):
    """One JSON object per line: ``{"step": 3, "time": ..., "loss": 0.5}``; text and hparams too.

    The file is opened for appending, so a resumed run continues the same log. ``flush()`` hands the lines to the
    operating system (an [`AsyncWriter`][ember.writers.AsyncWriter] does every ``flush_secs``), ``close()`` fsyncs.

    Args:
        path: the ``.jsonl`` file (its folder is created).

    Examples:
        >>> import json, tempfile, pathlib
        >>> from ember.writers import JsonlWriter
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl"
        >>> w = JsonlWriter(path)
        >>> w.write_scalars(3, {"loss": 0.5}); w.close()
        >>> row = json.loads(path.read_text()); row["step"], row["loss"]
        (3, 0.5)
    """

    _step = 0  # the last step written: write_hparams' record carries it, so a resume before it drops it

    def _line(self, record: Mapping[str, Any]) -> None:
        self._step = max(self._step, record.get("step", 0))
        self._open().write(json.dumps(record) + "\n")

    def _keep(self, line: str, step: int) -> bool:
        try:
            record = json.loads(line)
        except ValueError:
            return True  # not ours to judge: kept as it is
        return not (isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] > step)

    def write_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Append ``{"step", "time", **values}``."""
        self._line({"step": step, "time": time.time(), **{k: float(v) for k, v in values.items()}})

    def write_text(self, step: int, name: str, text: str) -> None:
        """Append ``{"step", "time", "text": {name: text}}``."""
        self._line({"step": step, "time": time.time(), "text": {name: text}})

    def write_array(self, step: int, name: str, array: Any) -> None:
        """Append ``{"step", "time", "array": {name: nested list}}``."""
        self._line({"step": step, "time": time.time(), "array": {name: np.asarray(array).tolist()}})

    def write_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, float] | None = None) -> None:
        """Append ``{"step", "hparams", "metrics"}``, at the last step written."""
        self._line({"step": self._step, "hparams": dict(hparams), "metrics": dict(metrics or {})})


class CsvWriter(_FileWriter):
    """Scalars as ``step,name,value`` rows: new names may appear at any time without rewriting the file.

    Args:
        path: the ``.csv`` file (its folder is created; a header is written when it is new).

    Examples:
        >>> import tempfile, pathlib
        >>> from ember.writers import CsvWriter
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "metrics.csv"
        >>> w = CsvWriter(path)
        >>> w.write_scalars(3, {"loss": 0.5, "lr": 0.1}); w.close()
        >>> print(path.read_text(), end="")
        step,name,value
        3,loss,0.5
        3,lr,0.1
    """

    _header = True

    def _keep(self, line: str, step: int) -> bool:
        first = line.split(",", 1)[0]
        return not (first.isdigit() and int(first) > step)

    def write_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Append one row per value."""
        new = self._file is None and (not self.path.exists() or self.path.stat().st_size == 0)
        out = csv.writer(self._open(), lineterminator="\n")
        if new:
            out.writerow(["step", "name", "value"])
        out.writerows([step, name, float(value)] for name, value in values.items())
