"""`BatchSpec`: the structure, shapes and dtypes of the first batch, checked on every later one."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

Leaf = tuple[tuple[int, ...], np.dtype[Any]]


def _leaf(x: Any) -> Leaf:
    if hasattr(x, "dtype"):
        return tuple(x.shape), np.dtype(x.dtype)
    return tuple(np.shape(x)), np.asarray(x).dtype


def _describe(treedef: Any, leaves: list[Leaf]) -> str:
    return f"{treedef} with leaves [{', '.join(f'{dtype}{list(shape)}' for shape, dtype in leaves)}]"


class BatchSpec:
    """Records the first batch; raises, showing both, when a later batch differs.

    The check costs a tree flatten and two comparisons per leaf. With ``allow_short=True`` a batch whose
    leading axis is shorter (a short last batch) passes. With ``stacked=True`` the batches hold K steps on
    a leading axis and only the per-step shape is compared, so a shorter trailing group passes.
    """

    __slots__ = ("allow_short", "leaves", "stacked", "treedef")

    def __init__(self, batch: Any, *, allow_short: bool = False, stacked: bool = False) -> None:
        flat, self.treedef = jax.tree.flatten(batch)
        self.stacked = stacked
        self.leaves = [self._key(x) for x in flat]
        self.allow_short = allow_short

    def _key(self, x: Any) -> Leaf:
        shape, dtype = _leaf(x)
        return (shape[1:] if self.stacked else shape), dtype

    def check(self, batch: Any) -> None:
        """Raise ``ValueError`` if ``batch`` differs from the first batch."""
        flat, treedef = jax.tree.flatten(batch)
        if treedef == self.treedef and not self.stacked:
            try:  # the hot path: arrays with .shape and .dtype that match exactly
                for x, (shape, dtype) in zip(flat, self.leaves, strict=True):
                    if x.shape != shape or x.dtype != dtype:
                        break
                else:
                    return
            except AttributeError:  # Python scalars: the careful path below
                pass
        if treedef == self.treedef and all(
            self._fits(self._key(x), want) for x, want in zip(flat, self.leaves, strict=True)
        ):
            return
        raise ValueError(
            "This batch differs from the first one, so the compiled step cannot take it.\n"
            f"  first batch: {_describe(self.treedef, self.leaves)}\n"
            f"  this batch:  {_describe(treedef, [self._key(x) for x in flat])}\n"
            "Give every batch the same structure, shapes and dtypes (drop_remainder=True drops a short last batch)."
        )

    def _fits(self, got: Leaf, want: Leaf) -> bool:
        (shape, dtype), (want_shape, want_dtype) = got, want
        if dtype != want_dtype:
            return False
        if shape == want_shape:
            return True
        return (
            self.allow_short
            and len(shape) == len(want_shape) > 0
            and shape[1:] == want_shape[1:]
            and shape[0] <= want_shape[0]
        )
