"""`MultiWriter`: one writer that fans every record out to several."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ember.writers._writer import Writer, array_writing, synced


class MultiWriter(Writer):
    """Sends every record to each of ``writers``, in order.

    Args:
        writers: the writers to fan out to.

    Examples:
        >>> import io
        >>> from ember.writers import ConsoleWriter, MultiWriter
        >>> a, b = io.StringIO(), io.StringIO()
        >>> w = MultiWriter([ConsoleWriter(a), ConsoleWriter(b)])
        >>> w.write_scalars(1, {"loss": 0.5})
        >>> a.getvalue().splitlines(), b.getvalue().splitlines()
        (['step 1 | loss 0.5000'], ['step 1 | loss 0.5000'])
    """

    def __init__(self, writers: Iterable[Writer]) -> None:
        self.writers = list(writers)
        bad = [w for w in self.writers if not isinstance(w, Writer)]
        if bad:
            raise TypeError(f"`writers` must all be ember.writers.Writer instances, got {bad!r}.")

    def write_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Fan out [`Writer.write_scalars`][ember.writers.Writer.write_scalars]."""
        for w in self.writers:
            w.write_scalars(step, values)

    def write_histogram(self, step: int, name: str, values: Any) -> None:
        """Fan out [`Writer.write_histogram`][ember.writers.Writer.write_histogram]."""
        for w in self.writers:
            w.write_histogram(step, name, values)

    def write_image(self, step: int, name: str, image: Any) -> None:
        """Fan out [`Writer.write_image`][ember.writers.Writer.write_image]."""
        for w in self.writers:
            w.write_image(step, name, image)

    def write_text(self, step: int, name: str, text: str) -> None:
        """Fan out [`Writer.write_text`][ember.writers.Writer.write_text]."""
        for w in self.writers:
            w.write_text(step, name, text)

    def write_array(self, step: int, name: str, array: Any) -> None:
        """Fan out [`Writer.write_array`][ember.writers.Writer.write_array]."""
        for w in self.writers:
            array_writing(w)(step, name, array)

    def write_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, float] | None = None) -> None:
        """Fan out [`Writer.write_hparams`][ember.writers.Writer.write_hparams]."""
        for w in self.writers:
            w.write_hparams(hparams, metrics)

    def resume_at(self, step: int) -> None:
        """Every writer drops what it logged after ``step``."""
        for w in self.writers:
            w.resume_at(step)

    def set_outcome(self, outcome: str) -> None:
        """Tell every writer how the run ended."""
        for w in self.writers:
            w.set_outcome(outcome)

    def flush(self) -> None:
        """Flush every writer."""
        for w in self.writers:
            w.flush()

    def sync(self) -> None:
        """Sync every writer."""
        for w in self.writers:
            synced(w)()

    def close(self) -> None:
        """Close every writer."""
        for w in self.writers:
            w.close()
