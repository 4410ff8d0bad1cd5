"""`TensorBoardWriter`: event files through tensorboardX."""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ember.writers._writer import Writer

_opened = itertools.count()


class TensorBoardWriter(Writer):
    """Writes TensorBoard event files in ``logdir`` (scalars, histograms, images, text, hparams).

    Args:
        logdir: the folder TensorBoard reads (created if missing).
        flush_secs: how often tensorboardX flushes on its own.

    Examples:
        >>> import tempfile, os
        >>> from ember.writers import TensorBoardWriter
        >>> logdir = tempfile.mkdtemp()
        >>> w = TensorBoardWriter(logdir)
        >>> w.write_scalars(1, {"loss": 0.5}); w.close()
        >>> [f.startswith("events.out.tfevents") for f in os.listdir(logdir)]
        [True]
    """

    def __init__(self, logdir: str | os.PathLike[str], *, flush_secs: int = 30) -> None:
        from tensorboardX import SummaryWriter  # imported here: the rest of ember works without loading it

        self.logdir = os.fspath(logdir)
        # tensorboardX names files by the second and the host: a second writer opened in the same second
        # (a quick resume) would clobber the first file, so the name also carries the process and a counter.
        suffix = f".{os.getpid()}.{next(_opened)}"
        self._writer = SummaryWriter(self.logdir, flush_secs=flush_secs, filename_suffix=suffix)

    def write_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """One scalar summary per value, tagged with its name."""
        for name, value in values.items():
            self._writer.add_scalar(name, float(value), global_step=step)

    def write_histogram(self, step: int, name: str, values: Any) -> None:
        """A histogram of ``values``."""
        self._writer.add_histogram(name, np.asarray(values), global_step=step)

    def write_image(self, step: int, name: str, image: Any) -> None:
        """An ``(H, W, C)`` image (needs Pillow: ``pip install 'ember[plots]'``)."""
        try:
            import PIL  # noqa: F401  # pyright: ignore[reportUnusedImport]  # tensorboardX encodes images with it
        except ImportError as e:
            raise ImportError("Writing images to TensorBoard needs Pillow: pip install 'ember[plots]'.") from e
        self._writer.add_image(name, np.asarray(image), global_step=step, dataformats="HWC")

    def write_text(self, step: int, name: str, text: str) -> None:
        """A text summary."""
        self._writer.add_text(name, text, global_step=step)

    def write_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, float] | None = None) -> None:
        """The HParams plugin's record of this run."""
        from tensorboardX.summary import hparams as hparams_summaries

        scores = {k: float(v) for k, v in (metrics or {}).items()}
        file_writer = self._writer._get_file_writer()  # into this run's file, not a new one in a subfolder
        for summary in hparams_summaries(dict(hparams), scores):
            file_writer.add_summary(summary)
        self.write_scalars(0, scores)

    def flush(self) -> None:
        """Flush pending events to disk."""
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()
