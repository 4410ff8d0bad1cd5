"""Data for ``ember train`` (``data.name=grain``) whose validation pass sends the process a signal midway.

With ``EMBER_TEST_SIGNAL_AT_PASS=N`` (and ``EMBER_TEST_SIGNAL``, SIGTERM by default), the N-th pass over the
validation data in this process sends the signal to its own process as it reads its second batch: an evaluation cut
short at a known point, whatever the machine's speed. Without it, plain data.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import numpy as np
from sklearn.datasets import load_digits


class Batches:
    """Arrays in batches of ``batch_size``, in order."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int) -> None:
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self) -> int:
        return len(self.x) // self.batch_size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield self.batch(i)

    def batch(self, i: int) -> dict[str, Any]:
        rows = slice(i * self.batch_size, (i + 1) * self.batch_size)
        return {"x": self.x[rows], "y": self.y[rows]}


class Signalling(Batches):
    """Validation batches whose ``at``-th pass in this process signals the process at its second batch."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, at: int | None, sig: int) -> None:
        super().__init__(x, y, batch_size)
        self.at, self.sig, self.passes = at, sig, 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.passes += 1
        for i in range(len(self)):
            if i == 1 and self.passes == self.at:
                os.kill(os.getpid(), self.sig)
            yield self.batch(i)

    def peek(self) -> dict[str, Any]:
        """The first batch, without a pass (what the evaluator compiles on ahead)."""
        return self.batch(0)


def make(batch_size: int, seed: int) -> tuple[Batches, Signalling]:
    """``(train, val)``: 1,400 digits to train on, the rest (4 batches of 96) to validate on."""
    digits = load_digits()
    x = (digits.images[..., None] / 16).astype("float32")
    y = digits.target.astype("int32")
    at = os.environ.get("EMBER_TEST_SIGNAL_AT_PASS")
    sig = getattr(signal, os.environ.get("EMBER_TEST_SIGNAL", "SIGTERM"))
    return Batches(x[:1400], y[:1400], batch_size), Signalling(x[1400:], y[1400:], 96, int(at) if at else None, sig)
