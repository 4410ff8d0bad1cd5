"""`BatchSpec`: the structure, shapes and dtypes of the first batch, checked on every later one.

The compiled steps check a batch when JAX traces them, which it does only for a batch whose structure, shapes or
dtypes it has not compiled for: the check costs nothing per step, and a differing batch is refused before XLA
compiles for it (a short last batch passes, and compiles once more).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

Leaf = tuple[tuple[int, ...], np.dtype[Any]]


def _leaf(x: Any) -> Leaf:
    """Shape and dtype as the compiled step sees them: a float64 NumPy array is float32 unless x64 is on."""
    dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
    return tuple(np.shape(x)), np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _leaf_str(leaf: Leaf) -> str:
    shape, dtype = leaf
    return f"{dtype}{list(shape)}"


def _describe(treedef: Any, leaves: list[Leaf]) -> str:
    return f"{treedef} with leaves [{', '.join(_leaf_str(leaf) for leaf in leaves)}]"


def _paths(treedef: Any) -> list[str]:
    """Each leaf's path in a tree of this structure, as ``jax.tree_util.keystr`` writes it (``['x']``)."""
    tree = jax.tree.unflatten(treedef, range(treedef.num_leaves))
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _dtypes_in_order(batch: Any) -> Any:
    """The dtypes of a bare array, or of a flat dict of arrays in its own order; ``None`` for any other batch."""
    if type(batch) is np.ndarray:
        return batch.dtype
    if type(batch) is dict:
        try:
            return [v.dtype for v in batch.values()]  # type: ignore[union-attr]  # else the AttributeError below
        except AttributeError:
            return None
    return None


class BatchSpec:
    """Records the first batch; raises, showing both, when a later batch differs.

    With ``allow_short=True`` a batch whose leading axis is shorter (a short last batch) passes. With
    ``stacked=True`` the batches hold K steps on a leading axis and only the per-step shape is compared, so a
    shorter trailing group passes. With ``per_device=True`` the first batch carries a device axis first
    (``Pmap``) and the later ones are each device's share, as ``jax.pmap`` traces them.
    """

    __slots__ = ("allow_short", "host_dtypes", "in_order", "leaves", "stacked", "treedef")

    def __init__(
        self, batch: Any, *, allow_short: bool = False, stacked: bool = False, per_device: bool = False
    ) -> None:
        flat, self.treedef = jax.tree.flatten(batch)
        self.stacked = stacked
        self.leaves = [self._key(x) for x in flat]
        self.host_dtypes = [getattr(x, "dtype", None) for x in flat]  # as given, before JAX converts float64
        self.in_order = _dtypes_in_order(batch)  # the same, read without flattening (a bare array, a flat dict)
        if per_device:
            self.leaves = [(shape[1:], dtype) for shape, dtype in self.leaves]
        self.allow_short = allow_short

    def _key(self, x: Any) -> Leaf:
        shape, dtype = _leaf(x)
        return (shape[1:] if self.stacked else shape), dtype

    def check(self, batch: Any) -> None:
        """Raise ``ValueError`` if ``batch`` differs from the first batch."""
        flat, treedef = jax.tree.flatten(batch)
        if treedef == self.treedef and all(
            self._fits(self._key(x), want) for x, want in zip(flat, self.leaves, strict=True)
        ):
            return
        got = [self._key(x) for x in flat]
        raise ValueError(
            "This batch differs from the first one, so the compiled step cannot take it.\n"
            f"  first batch: {_describe(self.treedef, self.leaves)}\n"
            f"  this batch:  {_describe(treedef, got)}\n"
            f"  first difference: {self._first_difference(treedef, got)}\n"
            "Give every batch the same structure, shapes and dtypes (drop_remainder=True drops a short last batch)."
        )

    def check_dtypes(self, batch: Any) -> None:
        """Raise ``ValueError`` if a leaf of ``batch`` has another dtype than the first batch's, as given.

        JAX converts a float64 array to float32 (unless x64 is on) before it looks at it, so a batch of float64 after
        float32 ones runs the same compiled step and `check` never sees it; this is the per-step look at the dtypes
        as given (a few hundred nanoseconds) that catches it.
        """
        if self.in_order is not None and _dtypes_in_order(batch) == self.in_order:
            return  # the common case: no flattening
        flat = jax.tree.leaves(batch)
        if [getattr(x, "dtype", None) for x in flat] == self.host_dtypes:
            return
        self.check(batch)  # another structure or shape: that error, if it is one
        paths = _paths(self.treedef)
        for path, x, want in zip(paths, flat, self.host_dtypes, strict=True):
            if getattr(x, "dtype", None) != want:
                raise ValueError(
                    "This batch differs from the first one: "
                    f"{path or 'the batch'} is {x.dtype}{list(np.shape(x))}, the first batch's was {want}. JAX would "
                    "convert it silently and train on; give every batch the same dtypes (a transform returning "
                    "float64 where it returned float32, say)."
                )

    def _first_difference(self, treedef: Any, got: list[Leaf]) -> str:
        want = dict(zip(_paths(self.treedef), self.leaves, strict=True))
        have = dict(zip(_paths(treedef), got, strict=True))
        for path in [*want, *(p for p in have if p not in want)]:
            if path not in have:
                return f"{path or 'the batch'} is missing (expected {_leaf_str(want[path])})"
            if path not in want:
                return f"{path or 'the batch'} is new (got {_leaf_str(have[path])})"
            if not self._fits(have[path], want[path]):
                return f"{path or 'the batch'}: expected {_leaf_str(want[path])}, got {_leaf_str(have[path])}"
        return "the structure"  # same paths and leaves, other node types (a tuple for a list)

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
