"""`Writer`: the interface every destination of numbers implements."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

#: How a run ended, as `Writer.set_outcome` takes it: ran to its end (or a handler ended it), raised, or was
#: stopped by a signal or Ctrl-C (a relaunch resumes it).
OUTCOMES = ("finished", "failed", "killed")


def check_outcome(outcome: str) -> str:
    """``outcome`` if it is one of ``OUTCOMES``; a ``ValueError`` naming it otherwise."""
    if outcome not in OUTCOMES:
        raise ValueError(f"`outcome` must be one of {list(OUTCOMES)}, got {outcome!r}.")
    return outcome


def synced(writer: Any) -> Callable[[], None]:
    """``writer.sync``, or its ``flush`` for a writer that has none.

    A class that matches the protocol without subclassing it inherits none of its methods.
    """
    return getattr(writer, "sync", writer.flush)


def array_writing(writer: Any) -> Callable[[int, str, Any], None]:
    """``writer.write_array``, or the protocol's (left out, said once) for a writer written before it existed."""
    return getattr(writer, "write_array", None) or functools.partial(Writer.write_array, writer)


@runtime_checkable
class Writer(Protocol):
    """Where a run's numbers go: scalars, and optionally histograms, images, text and hyperparameters.

    The contract (CLU's ``MetricWriter``, plus ``resume_at``): a writer subclasses this protocol and implements
    [`write_scalars`][ember.writers.Writer.write_scalars]; the other kinds default to doing nothing, so a writer
    that cannot show an image (a CSV file) simply skips it. Calls come from one thread at a time (an
    ``AsyncWriter``'s), in the order they were made; ``close()`` is the last call. Handlers take any object with
    these methods (``isinstance(obj, Writer)``). Values arrive as host numbers and numpy
    arrays, and histograms as a [`Histogram`][ember.writers.Histogram] on the host (or, from a caller of its own, an
    array): the [`AsyncWriter`][ember.writers.AsyncWriter] in front of every run's writers counts a device array's
    histogram on its devices and converts device values on its own thread, so the training loop never waits.

    Examples:
        >>> from ember.writers import Writer
        >>> class Remember(Writer):
        ...     def __init__(self):
        ...         self.rows = []
        ...
        ...     def write_scalars(self, step, values):
        ...         self.rows.append((step, dict(values)))
        >>> w = Remember()
        >>> w.write_scalars(3, {"loss": 0.5})
        >>> w.write_text(3, "note", "ignored"); w.rows
        [(3, {'loss': 0.5})]
    """

    def write_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Record ``values`` (name to number) at ``step``."""
        raise NotImplementedError(f"{type(self).__name__} must implement write_scalars(step, values).")

    def write_histogram(self, step: int, name: str, values: Any) -> None:
        """Record a [`Histogram`][ember.writers.Histogram] (or an array's) at ``step``; ignored unless overridden."""

    def write_image(self, step: int, name: str, image: Any) -> None:
        """Record an ``(H, W, C)`` uint8 or float image at ``step``; ignored unless overridden."""

    def write_text(self, step: int, name: str, text: str) -> None:
        """Record a piece of text at ``step``; ignored unless overridden."""

    def write_array(self, step: int, name: str, array: Any) -> None:
        """Record an array (a confusion matrix, per-class values) at ``step``.

        A writer that cannot show one leaves it out, and says so once per name (a warning on the ``ember.writers``
        logger); [`TensorBoardWriter`][ember.writers.TensorBoardWriter] shows it as a table,
        [`JsonlWriter`][ember.writers.JsonlWriter] records it as a nested list.

        Examples:
            >>> import numpy as np
            >>> from ember.writers import ConsoleWriter
            >>> ConsoleWriter().write_array(3, "val/cm", np.eye(2))  # a console shows numbers: left out, said once
        """
        said = vars(self).setdefault("_arrays_left_out", set())
        if name not in said:
            said.add(name)
            logging.getLogger("ember.writers").warning(
                "%s leaves out %r, an array of shape %s: it shows numbers only (TensorBoardWriter shows arrays as "
                "tables, JsonlWriter records them).",
                type(self).__name__,
                name,
                np.shape(array),
            )

    def write_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, float] | None = None) -> None:
        """Record the run's hyperparameters (and final metrics); ignored unless overridden."""

    def resume_at(self, step: int) -> None:
        """A resumed run goes on from ``step``: drop what was logged after it; ignored unless overridden.

        A run stopped past its last checkpoint logged steps the resumed run logs again. The file writers rewrite their
        file without them; TensorBoard's writer writes the mark that makes TensorBoard drop them.

        Examples:
            >>> import json, tempfile, pathlib
            >>> from ember.writers import JsonlWriter
            >>> path = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl"
            >>> w = JsonlWriter(path)
            >>> for step in (10, 20, 30): w.write_scalars(step, {"loss": 1 / step})
            >>> w.resume_at(20); w.write_scalars(30, {"loss": 0.5}); w.close()
            >>> [(r["step"], r["loss"]) for r in map(json.loads, path.read_text().splitlines())]
            [(10, 0.1), (20, 0.05), (30, 0.5)]
        """

    def set_outcome(self, outcome: str) -> None:
        """How the run ended, said before ``close``: ``"finished"``, ``"failed"`` or ``"killed"``; ignored by default.

        A tracker records it as the run's status (MLflow ``FINISHED`` / ``FAILED`` / ``KILLED``; W&B the exit code
        0 / 1 / 130). A writer never told closes as finished.

        Examples:
            >>> from ember.writers import ConsoleWriter
            >>> w = ConsoleWriter(); w.set_outcome("failed"); w.close()
        """

    def flush(self) -> None:
        """Push buffered records to their destination."""

    def sync(self) -> None:
        """Flush, and make what is in files durable (fsync) where the writer has files; by default, flush.

        Examples:
            >>> from ember.writers import ConsoleWriter
            >>> ConsoleWriter().sync()
        """
        self.flush()

    def close(self) -> None:
        """Flush and release files; the writer is not used afterwards."""
        self.flush()
