"""`StatePacking`: the fused metrics' accumulators carried through the compiled step as one vector per dtype.

Every array that goes into or comes out of a compiled call costs the host a buffer to track (a few
microseconds each on a GPU), and on XLA:CPU small independent outputs become branches the runtime runs
concurrently. Three metrics carry six or more scalars; packed, they are one or two vectors. The step
unpacks them with static slices (free inside XLA) and packs the new values again; a metric reads its own
part only when something asks for its state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


class StatePacking:
    """A fixed layout for a sequence of small pytrees of arrays: one flat vector per dtype.

    Args:
        states: example pytrees (one per metric); only their structure, shapes and dtypes are used.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.training._packing import StatePacking
        >>> states = ({"sum": jnp.array(2.0), "count": jnp.array(3)}, (jnp.zeros(2), jnp.array(1.0)))
        >>> packing = StatePacking(states)
        >>> packed = packing.pack(states)
        >>> [p.tolist() for p in packed]
        [[3], [2.0, 0.0, 0.0, 1.0]]
        >>> packing.unpack_one(packed, 1)[0].tolist(), int(packing.unpack(packed)[0]["count"])
        ([0.0, 0.0], 3)
    """

    def __init__(self, states: Sequence[Any]) -> None:
        self.dtypes: list[np.dtype[Any]] = []
        self._treedefs: list[Any] = []
        self._slots: list[list[tuple[int, int, tuple[int, ...]]]] = []  # per pytree: (vector, offset, shape)
        sizes: list[int] = []
        for state in states:
            leaves, treedef = jax.tree.flatten(state)
            slots = []
            for leaf in leaves:
                dtype, shape = np.dtype(leaf.dtype), tuple(np.shape(leaf))
                if dtype not in self.dtypes:
                    self.dtypes.append(dtype)
                    sizes.append(0)
                group = self.dtypes.index(dtype)
                slots.append((group, sizes[group], shape))
                sizes[group] += math.prod(shape)
            self._treedefs.append(treedef)
            self._slots.append(slots)
        self.pack = jax.jit(self._pack)
        self.unpack_one = jax.jit(self._unpack_one, static_argnums=1)

    def _pack(self, states: Sequence[Any]) -> tuple[jax.Array, ...]:
        """The vectors holding ``states`` (traceable: the step packs its new accumulators with it)."""
        parts: list[list[jax.Array]] = [[] for _ in self.dtypes]
        for state, slots in zip(states, self._slots, strict=True):
            for leaf, (group, _, _) in zip(jax.tree.leaves(state), slots, strict=True):
                parts[group].append(jnp.ravel(jnp.asarray(leaf, self.dtypes[group])))
        return tuple(jnp.concatenate(p) for p in parts)

    def _unpack_one(self, packed: Sequence[jax.Array], index: int) -> Any:
        leaves = [
            packed[group][offset : offset + math.prod(shape)].reshape(shape)
            for group, offset, shape in self._slots[index]
        ]
        return jax.tree.unflatten(self._treedefs[index], leaves)

    def unpack(self, packed: Sequence[jax.Array]) -> tuple[Any, ...]:
        """Every pytree back from the vectors (traceable; outside a trace, one dispatch per pytree)."""
        return tuple(self._unpack_one(packed, i) for i in range(len(self._slots)))
