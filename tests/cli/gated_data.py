"""Data for ``ember train`` (``data.name=grain``) whose first training pass waits at a gate: a file to appear.

With ``EMBER_TEST_GATE`` set, the tenth batch of the first pass waits (at most 120 s) until that file exists, so a
test can hold a training run at a known point until another job (a watcher) has acted. Without it, plain data.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.datasets import load_digits


class Gated:
    """The digits in batches, in order; the first pass waits at its tenth batch for the gate file."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, gate: Path | None) -> None:
        self.x, self.y, self.batch_size, self.gate = x, y, batch_size, gate

    def __len__(self) -> int:
        return len(self.x) // self.batch_size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            if i == 10 and self.gate is not None:
                self._wait()
            rows = slice(i * self.batch_size, (i + 1) * self.batch_size)
            yield {"x": self.x[rows], "y": self.y[rows]}

    def _wait(self) -> None:
        deadline = time.monotonic() + 120
        while not self.gate.exists():  # type: ignore[union-attr]  # only called with a gate
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gate {self.gate} did not open within 120 s")
            time.sleep(0.05)
        self.gate = None  # once


def make(batch_size: int, seed: int) -> tuple[Gated, list[dict[str, Any]]]:
    """``(train, val)``: 1,400 digits to train on (gated), the rest in one validation batch."""
    digits = load_digits()
    x = (digits.images[..., None] / 16).astype("float32")
    y = digits.target.astype("int32")
    gate = os.environ.get("EMBER_TEST_GATE")
    return Gated(x[:1400], y[:1400], batch_size, Path(gate) if gate else None), [{"x": x[1400:], "y": y[1400:]}]
