"""`ConsoleWriter`: a readable line per report, like flax-extra's summary logger."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import TextIO

from ember.writers._writer import Writer


def _format(value: float) -> str:
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.4e}"
    return f"{value:.4f}"


class ConsoleWriter(Writer):
    """Prints ``step N | s/step | name value | ...`` to a stream, one line per ``write_scalars``.

    Seconds per step are measured between consecutive reports on the host clock (dispatch is asynchronous,
    so they are exact over a run and smoothed between reports).

    Args:
        stream: where lines go (standard output by default).
        clock: seconds since some origin; injectable for tests.

    Examples:
        >>> import io
        >>> from ember.writers import ConsoleWriter
        >>> out, now = io.StringIO(), iter([0.0, 2.0])
        >>> w = ConsoleWriter(out, clock=lambda: next(now))
        >>> w.write_scalars(100, {"loss": 0.25})
        >>> w.write_scalars(200, {"loss": 0.125, "val/accuracy": 0.9})
        >>> print(out.getvalue(), end="")
        step 100 | loss 0.2500
        step 200 | 0.0200 s/step | loss 0.1250 | val/accuracy 0.9000
    """

    def __init__(self, stream: TextIO | None = None, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.stream = stream
        self._clock = clock
        self._last: tuple[int, float] | None = None

    def write_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Print one line for ``step``."""
        now = self._clock()
        parts = [f"step {step}"]
        if self._last is not None and step > self._last[0]:
            parts.append(f"{(now - self._last[1]) / (step - self._last[0]):.4f} s/step")
        self._last = (step, now)
        parts += [f"{name} {_format(float(value))}" for name, value in values.items()]
        print(" | ".join(parts), file=self.stream or sys.stdout)

    def write_text(self, step: int, name: str, text: str) -> None:
        """Print ``text`` under its name."""
        print(f"step {step} | {name}: {text}", file=self.stream or sys.stdout)

    def flush(self) -> None:
        """Flush the stream."""
        (self.stream or sys.stdout).flush()
