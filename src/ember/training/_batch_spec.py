"""`BatchSpec`: the structure, shapes and dtypes of the first batch, checked on every later one."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def _leaf(x: Any) -> tuple[tuple[int, ...], np.dtype[Any]]:
    if hasattr(x, "dtype"):
        return tuple(x.shape), np.dtype(x.dtype)
    return tuple(np.shape(x)), np.asarray(x).dtype


def _describe(treedef: Any, leaves: list[tuple[tuple[int, ...], np.dtype[Any]]]) -> str:
    return f"{treedef} with leaves [{', '.join(f'{dtype}{list(shape)}' for shape, dtype in leaves)}]"


class BatchSpec:
    """Records the first batch; raises, showing both, when a later batch differs.

    The check costs a tree flatten and two comparisons per leaf. With ``allow_short=True`` a batch whose
    leading axis is shorter (a short last batch) passes.
    """

    __slots__ = ("allow_short", "leaves", "treedef")

    def __init__(self, batch: Any, *, allow_short: bool = False) -> None:
        flat, self.treedef = jax.tree.flatten(batch)
        self.leaves = [_leaf(x) for x in flat]
        self.allow_short = allow_short

    def _fits(self, x: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> bool:
        got_shape, got_dtype = (x.shape, x.dtype) if hasattr(x, "dtype") else _leaf(x)
        if got_dtype != dtype:
            return False
        if got_shape == shape:
            return True
        return (
            self.allow_short
            and len(got_shape) == len(shape) > 0
            and got_shape[1:] == shape[1:]
            and got_shape[0] <= shape[0]
        )

    def check(self, batch: Any) -> None:
        """Raise ``ValueError`` if ``batch`` differs from the first batch."""
        flat, treedef = jax.tree.flatten(batch)
        if treedef == self.treedef and all(self._fits(x, s, d) for x, (s, d) in zip(flat, self.leaves, strict=True)):
            return
        raise ValueError(
            "This batch differs from the first one, so the compiled step cannot take it.\n"
            f"  first batch: {_describe(self.treedef, self.leaves)}\n"
            f"  this batch:  {_describe(treedef, [_leaf(x) for x in flat])}\n"
            "Give every batch the same structure, shapes and dtypes (drop_remainder=True drops a short last batch)."
        )
