"""`TensorBoardWriter`: event files through tensorboardX."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ember._atomic_file import fsync_path
from ember._extras import missing
from ember.writers._files import writable_folder
from ember.writers._histogram import Histogram, histogram
from ember.writers._writer import Writer

_opened = itertools.count()


#: tensorboardX majors whose private ``event_file_writer.EventsWriter`` this writer was checked against.
TESTED_MAJORS = ("2",)


def events_writer_class() -> Any:
    """The ``EventsWriter`` of tensorboardX: private, used because only it flushes what was written (see below).

    Imported here, so the rest of ember works without loading tensorboardX; a tensorboardX major it was not
    checked against is refused by name rather than trusted (``tests/writers`` checks the API it relies on).
    """
    import tensorboardX

    major = str(tensorboardX.__version__).split(".", 1)[0]
    if major not in TESTED_MAJORS:
        raise ImportError(
            f"TensorBoardWriter uses tensorboardX's EventsWriter, checked with tensorboardX {TESTED_MAJORS[-1]}.x; "
            f"tensorboardX {tensorboardX.__version__} is installed: pip install 'tensorboardX<{int(major)}'."
        )
    from tensorboardX.event_file_writer import EventsWriter

    return EventsWriter


def array_table(array: np.ndarray) -> str:
    """``array`` as a Markdown table (TensorBoard's Text tab draws one): a row per row, a 1-D array as one row.

    An array of more than two dimensions is written as its nested list.

    Examples:
        >>> import numpy as np
        >>> from ember.writers._tensorboard import array_table
        >>> print(array_table(np.array([[5, 1], [0, 4]])))
        | | 0 | 1 |
        |---|---|---|
        | **0** | 5 | 1 |
        | **1** | 0 | 4 |
    """
    if array.ndim > 2:
        return str(array.tolist())
    rows = np.atleast_2d(array)
    head = "| | " + " | ".join(str(j) for j in range(rows.shape[1])) + " |"
    rule = "|---" * (rows.shape[1] + 1) + "|"
    body = [f"| **{i}** | " + " | ".join(f"{x:g}" for x in row.tolist()) + " |" for i, row in enumerate(rows)]
    return "\n".join([head, rule, *body])


class TensorBoardWriter(Writer):
    """Writes TensorBoard event files in ``logdir`` (scalars, histograms, images, text, hparams).

    Events are written in the caller's thread (an [`AsyncWriter`][ember.writers.AsyncWriter] around it keeps that off
    the training loop), so [`flush`][ember.writers.TensorBoardWriter.flush] puts every event written so far on disk.
    tensorboardX's own ``SummaryWriter`` queues events for a thread of its own, and its ``flush()`` does not wait for
    that queue: the last events of a run could be missing until ``close()``. Summaries are built with
    ``tensorboardX.summary``.

    Args:
        logdir: the folder TensorBoard reads (created if missing).
        flush_secs: at most this long between flushes while events arrive, for a live TensorBoard.

    Examples:
        >>> import tempfile, os
        >>> from ember.writers import TensorBoardWriter
        >>> logdir = tempfile.mkdtemp()
        >>> w = TensorBoardWriter(logdir)
        >>> w.write_scalars(1, {"loss": 0.5}); w.close()
        >>> [f.startswith("events.out.tfevents") for f in os.listdir(logdir)]
        [True]
    """

    def __init__(self, logdir: str | os.PathLike[str], *, flush_secs: float = 30) -> None:
        if not isinstance(flush_secs, int | float) or isinstance(flush_secs, bool) or flush_secs <= 0:
            raise ValueError(f"`flush_secs` must be a positive number of seconds, got {flush_secs!r}.")
        self.logdir = os.fspath(writable_folder(logdir, "logdir", "TensorBoardWriter"))
        # tensorboardX names files by the second and the host: a second writer opened in the same second
        # (a quick resume) would clobber the first file, so the name also carries the process and a counter.
        # The file is opened at the first write, so a run that writes nothing (a relaunch of a finished run)
        # leaves no empty event file behind.
        self._events: Any = None
        self._step = 0  # the last step written: the final metrics of write_hparams are written there
        self._curves: dict[str, int] = {}  # each scalar's last step: a final metric already there is not repeated
        self.flush_secs = flush_secs
        self._flushed = time.monotonic()

    def _write(self, step: int, summary: Any) -> None:
        from tensorboardX.proto.event_pb2 import Event  # pyright: ignore[reportAttributeAccessIssue]  # generated

        self._step = max(self._step, int(step))
        self._event(Event(summary=summary, step=int(step), wall_time=time.time()))

    def _event(self, event: Any) -> None:
        if self._events is None:
            EventsWriter = events_writer_class()  # a class
            suffix = f".{os.getpid()}.{next(_opened):06d}"  # padded: files sort in the order they were opened
            self._events = EventsWriter(os.path.join(self.logdir, "events"), suffix)
        self._events.write_event(event)
        if time.monotonic() - self._flushed > self.flush_secs:
            self.flush()

    def resume_at(self, step: int) -> None:
        """Write TensorBoard's purge mark, a ``SessionLog.START`` at ``step + 1``: it drops the steps logged past it.

        tensorboardX's ``SummaryWriter(purge_step=...)`` writes the same event when it opens.
        """
        # the ignore below: tensorboardX's generated protobuf modules carry no type stubs
        from tensorboardX.proto.event_pb2 import Event, SessionLog  # pyright: ignore[reportAttributeAccessIssue]

        self._event(Event(step=int(step) + 1, wall_time=time.time(), session_log=SessionLog(status=SessionLog.START)))

    def write_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """One scalar summary per value, tagged with its name."""
        from tensorboardX.summary import scalar

        for name, value in values.items():
            self._write(step, scalar(name, float(value)))
            self._curves[name] = int(step)

    def write_histogram(self, step: int, name: str, values: Any) -> None:
        """A histogram: a [`Histogram`][ember.writers.Histogram] as it is, or an array's over TensorBoard's buckets."""
        # the ignore below: tensorboardX's generated protobuf modules carry no type stubs
        from tensorboardX.proto.summary_pb2 import HistogramProto, Summary  # pyright: ignore[reportAttributeAccessIssue]

        h = (values if isinstance(values, Histogram) else histogram(np.asarray(values))).on_host()
        limits, counts = h.trimmed()
        proto = HistogramProto(
            min=float(h.min),
            max=float(h.max),
            num=float(h.num),
            sum=float(h.sum),
            sum_squares=float(h.sum_squares),
            bucket_limit=limits.tolist(),
            bucket=counts.tolist(),
        )
        self._write(step, Summary(value=[Summary.Value(tag=name, histo=proto)]))

    def write_image(self, step: int, name: str, image: Any) -> None:
        """An ``(H, W, C)`` image (needs Pillow: ``pip install -e ".[plots]"``)."""
        try:
            import PIL  # noqa: F401  # pyright: ignore[reportUnusedImport]  # tensorboardX encodes images with it
        except ImportError as e:
            raise ImportError(missing("Writing images to TensorBoard", "Pillow", "plots")) from e
        from tensorboardX.summary import image as image_summary

        self._write(step, image_summary(name, np.asarray(image), dataformats="HWC"))

    def write_text(self, step: int, name: str, text: str) -> None:
        """A text summary."""
        from tensorboardX.summary import text as text_summary

        self._write(step, text_summary(name, text))

    def write_array(self, step: int, name: str, array: Any) -> None:
        """An array as text: a table (rows by columns, as a confusion matrix reads) in TensorBoard's Text tab."""
        self.write_text(step, name, array_table(np.asarray(array)))

    def write_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, float] | None = None) -> None:
        """The HParams plugin's record of this run, in this run's file; ``metrics`` as scalars at the last step written.

        At the last step, not at 0: a metric that is also a curve (``val/accuracy``) keeps its curve going forward, and
        one the curve already has at that step is not written twice (the HParams tab reads the curve's last value).
        """
        from tensorboardX.summary import hparams as hparams_summaries

        scores = {k: float(v) for k, v in (metrics or {}).items()}
        step = self._step
        for summary in hparams_summaries(dict(hparams), scores):
            self._write(step, summary)
        self.write_scalars(step, {k: v for k, v in scores.items() if self._curves.get(k) != step})

    def flush(self) -> None:
        """Put every event written so far on disk."""
        if self._events is not None:
            self._events.flush()
        self._flushed = time.monotonic()

    def sync(self) -> None:
        """Flush, and fsync the event file and the folder's entry for it."""
        self.flush()
        if self._events is not None:
            fsync_path(Path(self._events._file_name))  # pyright: ignore[reportPrivateUsage]  # see EventsWriter
            fsync_path(Path(self.logdir))

    def close(self) -> None:
        """Flush and close the event file."""
        if self._events is not None:
            self._events.close()
