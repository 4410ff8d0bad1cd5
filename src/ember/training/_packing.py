"""`StatePacking`: the fused metrics' accumulators carried through the compiled step as one vector per width.

Every array that goes into or comes out of a compiled call costs the host a buffer to track, and on
XLA:CPU small independent outputs become branches the runtime runs concurrently. Three metrics carry six
or more scalars (float sums, integer counts); packed, they are one vector of 32-bit words, each value
stored by its bits (``lax.bitcast_convert_type``, exact and free inside XLA). The step unpacks them with
static slices and packs the new values again; a metric reads its own part only when something asks for
its state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_WORDS = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def _to_words(leaf: jax.Array) -> jax.Array:
    """The leaf's values as unsigned words of the same width, bit for bit (bool as 0/1 bytes)."""
    if leaf.dtype == jnp.bool_:
        return leaf.astype(jnp.uint8)
    return lax.bitcast_convert_type(leaf, _WORDS[leaf.dtype.itemsize])


def _from_words(words: jax.Array, dtype: np.dtype[Any]) -> jax.Array:
    if dtype == np.bool_:
        return words.astype(jnp.bool_)
    return lax.bitcast_convert_type(words, dtype)


class StatePacking:
    """A fixed layout for a sequence of small pytrees of arrays: one flat vector of words per byte width.

    Args:
        states: example pytrees (one per metric); only their structure, shapes and dtypes are used.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.training._packing import StatePacking
        >>> states = ({"sum": jnp.array(2.0), "count": jnp.array(3)}, (jnp.zeros(2), jnp.array(1.0)))
        >>> packing = StatePacking(states)
        >>> packed = packing.pack(states)
        >>> [(p.dtype.name, p.shape) for p in packed]  # int32 and float32 values share one vector
        [('uint32', (5,))]
        >>> packing.unpack_one(packed, 1)[0].tolist(), packing.unpack(packed)[0]
        ([0.0, 0.0], {'count': Array(3, dtype=int32), 'sum': Array(2., dtype=float32)})
    """

    def __init__(self, states: Sequence[Any]) -> None:
        self.widths: list[int] = []  # bytes per word of each vector
        self._treedefs: list[Any] = []
        # per pytree, per leaf: (vector, offset, shape, dtype)
        self._slots: list[list[tuple[int, int, tuple[int, ...], np.dtype[Any]]]] = []
        sizes: list[int] = []
        for state in states:
            leaves, treedef = jax.tree.flatten(state)
            slots = []
            for leaf in leaves:
                dtype, shape = np.dtype(leaf.dtype), tuple(np.shape(leaf))
                if dtype.itemsize not in self.widths:
                    self.widths.append(dtype.itemsize)
                    sizes.append(0)
                group = self.widths.index(dtype.itemsize)
                slots.append((group, sizes[group], shape, dtype))
                sizes[group] += math.prod(shape)
            self._treedefs.append(treedef)
            self._slots.append(slots)
        self.pack = jax.jit(self._pack)
        self.unpack_one = jax.jit(self._unpack_one, static_argnums=1)

    def _pack(self, states: Sequence[Any]) -> tuple[jax.Array, ...]:
        """The vectors holding ``states`` (traceable: the step packs its new accumulators with it)."""
        parts: list[list[jax.Array]] = [[] for _ in self.widths]
        for state, slots in zip(states, self._slots, strict=True):
            for leaf, (group, _, _, dtype) in zip(jax.tree.leaves(state), slots, strict=True):
                parts[group].append(jnp.ravel(_to_words(jnp.asarray(leaf, dtype))))
        return tuple(jnp.concatenate(p) for p in parts)

    def _unpack_one(self, packed: Sequence[jax.Array], index: int) -> Any:
        leaves = [
            _from_words(packed[group][offset : offset + math.prod(shape)].reshape(shape), dtype)
            for group, offset, shape, dtype in self._slots[index]
        ]
        return jax.tree.unflatten(self._treedefs[index], leaves)

    def unpack(self, packed: Sequence[jax.Array]) -> tuple[Any, ...]:
        """Every pytree back from the vectors (traceable; outside a trace, one dispatch per pytree)."""
        return tuple(self._unpack_one(packed, i) for i in range(len(self._slots)))
