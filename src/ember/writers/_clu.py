"""CLU's ``MetricWriter`` and ember's ``Writer``, each usable where the other is expected."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ember.writers._histogram import Histogram
from ember.writers._writer import Writer

#: What a CLU ``MetricWriter`` must have for ember to write through it.
_CLU_METHODS = ("write_scalars", "write_images", "write_texts", "write_histograms", "write_hparams", "flush", "close")


class CluWriter(Writer):
    """A CLU ``MetricWriter`` (``clu.metric_writers``) as an ember writer, for ember's loggers and handlers.

    Scalars go to ``write_scalars``; a histogram, an image (as a batch of one) and a text go to
    ``write_histograms``, ``write_images`` and ``write_texts`` under their name; hyperparameters to
    ``write_hparams``, and the final metrics of ``write_hparams`` as scalars at the last step written (CLU's
    hyperparameters take no metrics).

    Args:
        metric_writer: any CLU ``MetricWriter`` (``SummaryWriter``, ``AsyncMultiWriter``, ``LoggingWriter``...).

    Examples:
        >>> from ember.writers import CluWriter
        >>> class Printing:  # stands in for a CLU writer here; CLU's own import needs TensorFlow
        ...     def write_scalars(self, step, scalars): print(step, dict(scalars))
        ...     write_images = write_texts = write_histograms = write_hparams = flush = close = print
        >>> CluWriter(Printing()).write_scalars(3, {"loss": 0.5})
        3 {'loss': 0.5}
    """

    def __init__(self, metric_writer: Any) -> None:
        missing = [name for name in _CLU_METHODS if not callable(getattr(metric_writer, name, None))]
        if missing:
            raise TypeError(
                f"`metric_writer` must be a CLU MetricWriter; {type(metric_writer).__name__} lacks {missing}."
            )
        self.metric_writer = metric_writer
        self._step = 0

    def write_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """``write_scalars(step, values)``."""
        self._step = int(step)
        self.metric_writer.write_scalars(int(step), {k: float(v) for k, v in values.items()})

    def write_histogram(self, step: int, name: str, values: Any) -> None:
        """``write_histograms(step, {name: values})``.

        CLU's writers take raw values and bucket them themselves; a [`Histogram`][ember.writers.Histogram] counted on
        device reaches them as its buckets' midpoints, each repeated in proportion to its count (at most 10,000
        values in all): the same shape, bucketed again by CLU.
        """
        if isinstance(values, Histogram):
            counts, edges = values.on_host().numpy()
            scaled = np.round(counts * min(1.0, 10_000 / max(int(counts.sum()), 1))).astype(np.int64)
            values = np.repeat((edges[:-1] + edges[1:]) / 2, np.maximum(scaled, counts > 0))
        self.metric_writer.write_histograms(int(step), {name: np.asarray(values)})

    def write_image(self, step: int, name: str, image: Any) -> None:
        """``write_images(step, {name: image[None]})``: CLU takes a batch of images."""
        self.metric_writer.write_images(int(step), {name: np.asarray(image)[None]})

    def write_text(self, step: int, name: str, text: str) -> None:
        """``write_texts(step, {name: text})``."""
        self.metric_writer.write_texts(int(step), {name: text})

    def write_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, float] | None = None) -> None:
        """``write_hparams(hparams)``; ``metrics`` as scalars at the last step written."""
        self.metric_writer.write_hparams(dict(hparams))
        if metrics:
            self.write_scalars(self._step, metrics)

    def flush(self) -> None:
        """``flush()``."""
        self.metric_writer.flush()

    def close(self) -> None:
        """``close()``."""
        self.metric_writer.close()


class MetricWriterAdapter:
    """An ember writer with CLU's ``MetricWriter`` methods, for code written against CLU (``as_clu_writer``).

    ``write_scalars``, ``write_texts``, ``write_histograms`` and ``write_hparams`` map one to one; each image
    of ``write_images`` batches becomes an ember image (``name``, or ``name/i`` for a batch of several);
    ``write_summaries`` writes 0-d values as scalars and others as histograms. ember's writers take no
    videos or audio: those raise ``NotImplementedError`` rather than drop the data.

    Examples:
        >>> import io, numpy as np
        >>> from ember.writers import ConsoleWriter, MetricWriterAdapter
        >>> out = io.StringIO()
        >>> MetricWriterAdapter(ConsoleWriter(out)).write_summaries(1, {"acc": np.array(0.75)})
        >>> out.getvalue().split(" | ")[-1].strip()
        'acc 0.7500'
    """

    def __init__(self, writer: Writer) -> None:
        if not isinstance(writer, Writer):
            raise TypeError(f"`writer` must be an ember Writer, got {type(writer).__name__}.")
        self.writer = writer

    def write_summaries(self, step: int, values: Mapping[str, Any], metadata: Mapping[str, Any] | None = None) -> None:
        """0-d values as scalars, the others as histograms."""
        arrays = {name: np.asarray(value) for name, value in values.items()}
        scalars = {name: float(a) for name, a in arrays.items() if a.ndim == 0}
        if scalars:
            self.writer.write_scalars(step, scalars)
        for name, a in arrays.items():
            if a.ndim:
                self.writer.write_histogram(step, name, a)

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        """The ember writer's ``write_scalars``."""
        self.writer.write_scalars(step, scalars)

    def write_images(self, step: int, images: Mapping[str, Any]) -> None:
        """Each image of each ``[N, H, W, C]`` batch (or single ``[H, W, C]`` image) as an ember image."""
        for name, batch in images.items():
            batch = np.asarray(batch)
            batch = batch[None] if batch.ndim == 3 else batch
            for i, image in enumerate(batch):
                self.writer.write_image(step, name if len(batch) == 1 else f"{name}/{i}", image)

    def write_videos(self, step: int, videos: Mapping[str, Any]) -> None:
        """Not supported: ember's writers take no video."""
        raise NotImplementedError(f"ember's writers take no video; {sorted(videos)} were not written.")

    def write_audios(self, step: int, audios: Mapping[str, Any], *, sample_rate: int) -> None:
        """Not supported: ember's writers take no audio."""
        raise NotImplementedError(f"ember's writers take no audio; {sorted(audios)} were not written.")

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Each text with the ember writer's ``write_text``."""
        for name, text in texts.items():
            self.writer.write_text(step, name, text)

    def write_histograms(
        self, step: int, arrays: Mapping[str, Any], num_buckets: Mapping[str, int] | None = None
    ) -> None:
        """Each array with the ember writer's ``write_histogram`` (its own buckets)."""
        for name, values in arrays.items():
            self.writer.write_histogram(step, name, values)

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """The ember writer's ``write_hparams``."""
        self.writer.write_hparams(hparams)

    def flush(self) -> None:
        """The ember writer's ``flush``."""
        self.writer.flush()

    def close(self) -> None:
        """The ember writer's ``close``."""
        self.writer.close()


def as_clu_writer(writer: Writer) -> MetricWriterAdapter:
    """``writer`` where CLU code expects a ``MetricWriter``; an instance of it too when CLU imports.

    CLU's ``metric_writers`` package imports TensorFlow; where it imports, the adapter is registered as a
    ``MetricWriter``, so ``isinstance`` checks pass; elsewhere it is the same methods, duck-typed.

    Examples:
        >>> import io
        >>> from ember.writers import ConsoleWriter, as_clu_writer
        >>> out = io.StringIO()
        >>> as_clu_writer(ConsoleWriter(out)).write_scalars(2, {"loss": 0.5})
        >>> out.getvalue().split(" | ")[-1].strip()
        'loss 0.5000'
    """
    try:
        # the ignore below: CLU is optional: its interface module is not installed with ember
        from clu.metric_writers.interface import MetricWriter  # pyright: ignore[reportMissingImports]

        # the ignore below: ABCMeta.register is untyped in CLU's stubs
        MetricWriter.register(MetricWriterAdapter)  # pyright: ignore[reportUnknownMemberType]
    except ImportError:  # no CLU, or CLU without TensorFlow
        pass
    return MetricWriterAdapter(writer)
