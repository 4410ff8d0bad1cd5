"""`Histogram`: the distribution of an array, counted where the array lives (on its devices), read as a few numbers.

A histogram handler never brings a parameter to the host: the counts over TensorBoard's usual bucket edges, and the
min, max, count, sum and sum of squares, are computed on the array's own devices by one compiled call (across
processes for an array sharded over several), and only those ~1,500 numbers cross to the host.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np


def tensorboard_edges() -> np.ndarray:
    """TensorBoard's usual histogram bucket edges: +-1e-12 growing by 10% to +-1e20, and 0 (1,549 edges).

    Examples:
        >>> from ember.writers import tensorboard_edges
        >>> edges = tensorboard_edges()
        >>> len(edges), float(edges[len(edges) // 2])
        (1549, 0.0)
    """
    edges, v = [], 1e-12
    while v < 1e20:
        edges.append(v)
        v *= 1.1
    return np.array([-e for e in reversed(edges)] + [0.0] + edges)


class Histogram(NamedTuple):
    """The histogram of an array over fixed bucket edges, with its summary numbers (TensorBoard's fields).

    ``bucket_counts[i]`` counts the values in ``[bucket_limits[i], bucket_limits[i + 1])`` (the last bucket includes
    its right edge), as ``numpy.histogram`` does; values outside the edges count in ``num`` and the sums only. Made
    by [`histogram`][ember.writers.histogram] (fields are then device arrays) or
    [`on_host`][ember.writers.Histogram.on_host] (NumPy).

    Examples:
        >>> import numpy as np
        >>> from ember.writers import histogram
        >>> h = histogram(np.array([0.5, 1.5, 1.5]), edges=np.array([0.0, 1.0, 2.0])).on_host()
        >>> h.bucket_counts.tolist(), float(h.sum), int(h.num)
        ([1, 2], 3.5, 3)
    """

    min: Any
    max: Any
    num: Any
    sum: Any
    sum_squares: Any
    bucket_limits: Any
    bucket_counts: Any

    def on_host(self) -> Histogram:
        """This histogram with NumPy fields (a small read: the edges and counts, and five numbers).

        Examples:
            >>> import numpy as np
            >>> from ember.writers import histogram
            >>> type(histogram(np.ones(3)).on_host().bucket_counts).__name__
            'ndarray'
        """
        return Histogram(*(np.asarray(field) for field in self))

    def numpy(self, max_buckets: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(counts, edges)`` as ``numpy.histogram`` gives them, from the first to the last non-empty bucket.

        With ``max_buckets``, neighbouring buckets are merged until there are at most that many (W&B takes 512).
        Call on a histogram on the host.

        Examples:
            >>> import numpy as np
            >>> from ember.writers import histogram
            >>> counts, edges = histogram(np.array([1.5, 2.5, 2.5]), edges=np.arange(5.0)).on_host().numpy()
            >>> counts.tolist(), edges.tolist()
            ([1, 2], [1.0, 2.0, 3.0])
        """
        counts, edges = np.asarray(self.bucket_counts), np.asarray(self.bucket_limits)
        nonzero = np.flatnonzero(counts > 0)
        if not len(nonzero):
            raise ValueError("The histogram has no value inside its bucket edges.")
        start, end = int(nonzero[0]), int(nonzero[-1]) + 1
        counts, edges = counts[start:end], edges[start : end + 1]
        if max_buckets is not None and len(counts) > max_buckets:
            group = -(-len(counts) // max_buckets)
            padded = np.concatenate([counts, np.zeros(-len(counts) % group, counts.dtype)])
            counts = padded.reshape(-1, group).sum(axis=1)
            edges = np.concatenate([edges[:-1:group], edges[-1:]])
        return counts, edges

    def trimmed(self) -> tuple[np.ndarray, np.ndarray]:
        """``(limits, counts)`` as TensorBoard stores them: each bucket's right edge, an empty bucket first.

        TensorBoard keeps only right edges, so an empty bucket is kept left of the first non-empty one (as
        ``tensorboardX.summary.make_histogram`` does). Call on a histogram on the host.

        Examples:
            >>> import numpy as np
            >>> from ember.writers import histogram
            >>> limits, counts = histogram(np.array([1.5]), edges=np.arange(5.0)).on_host().trimmed()
            >>> limits.tolist(), counts.tolist()
            ([1.0, 2.0], [0, 1])
        """
        counts, edges = self.numpy()
        return edges, np.concatenate([[0], counts])


def histogram(values: Any, *, edges: Any = None) -> Histogram:
    """The histogram of ``values`` over ``edges`` (TensorBoard's by default), computed where ``values`` live.

    A device array is counted by one compiled call on its own devices (for an array sharded across processes every
    process must call this, as each calls a handler); the result is replicated on them, small, and fetched only when
    read. Values are compared with the edges in float32 there, so a value within one float32 step of an edge may
    count in the bucket beside the one NumPy gives. NumPy input is counted on the host.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.writers import histogram
        >>> h = histogram(jnp.array([-1.0, 0.0, 2.0])).on_host()
        >>> float(h.min), float(h.max), int(h.bucket_counts.sum())
        (-1.0, 2.0, 3)
    """
    import jax
    import jax.numpy as jnp

    limits = tensorboard_edges() if edges is None else np.asarray(edges, np.float64)
    if limits.ndim != 1 or len(limits) < 2 or np.any(np.diff(limits) <= 0):
        raise ValueError(f"`edges` must be an increasing 1-d sequence of at least 2 numbers, got {edges!r}.")
    if not isinstance(values, jax.Array):
        v = np.asarray(values, np.float64).ravel()
        counts = np.histogram(v, bins=limits)[0] if v.size else np.zeros(len(limits) - 1, np.int64)
        return Histogram(v.min(), v.max(), v.size, v.sum(), v @ v, limits, counts)
    counted = _compiled(_replicated(values.sharding))(values, jnp.asarray(limits, jnp.float32))
    return counted._replace(bucket_limits=limits)  # the edges as given, not their float32 copy


def _replicated(sharding: Any) -> Any:
    """Where a histogram of an array with ``sharding`` goes: on all of its devices (``None``: one device)."""
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(sharding.mesh, PartitionSpec()) if isinstance(sharding, NamedSharding) else None


@functools.cache
def _compiled(out: Any) -> Any:
    import jax
    import jax.numpy as jnp

    def count(x: Any, edges: Any) -> Histogram:
        v = x.ravel().astype(jnp.float32)
        n = edges.shape[0] - 1
        index = jnp.searchsorted(edges, v, side="right") - 1
        index = jnp.where(v == edges[-1], n - 1, index)  # the last bucket includes its right edge
        inside = (index >= 0) & (index < n)
        counts = jnp.zeros(n, jnp.int32).at[jnp.where(inside, index, 0)].add(inside.astype(jnp.int32))
        return Histogram(v.min(), v.max(), jnp.int32(v.size), v.sum(), jnp.dot(v, v), None, counts)

    return jax.jit(count) if out is None else jax.jit(count, out_shardings=out)
