"""Data for ``ember train`` (``data.name=grain``) that reshuffles each pass from NumPy's global random state.

The state is seeded once, when the data is made, and a checkpoint does not hold it: a relaunch that resumes after
the first pass draws the first pass's order again. `ember verify-resume` must catch it by default.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from sklearn.datasets import load_digits


class Reshuffled:
    """The digits in batches, in a new order each pass, drawn from ``np.random`` (not restored on a resume)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int) -> None:
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self) -> int:
        return len(self.x) // self.batch_size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        order = np.random.permutation(len(self.x))  # the fault under test: the global state
        for i in range(len(self)):
            rows = order[i * self.batch_size : (i + 1) * self.batch_size]
            yield {"x": self.x[rows], "y": self.y[rows]}


def make(batch_size: int, seed: int) -> tuple[Reshuffled, list[dict[str, Any]]]:
    """``(train, val)``: 1,400 digits reshuffled each pass, the rest in one validation batch."""
    np.random.seed(seed)
    digits = load_digits()
    x = (digits.images[..., None] / 16).astype("float32")
    y = digits.target.astype("int32")
    return Reshuffled(x[:1400], y[:1400], batch_size), [{"x": x[1400:], "y": y[1400:]}]
