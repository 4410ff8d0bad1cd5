"""`FusedMetrics`: the metric updates a training engine folds into its compiled step, and their carry.

A fused metric's accumulators do not live in the metric while the engine runs: they travel through the
compiled call packed (:class:`StatePacking`, one vector of words per byte width) in a :class:`Carry`,
and the metric reads its part back only when something asks for its state. The host's work per call
does not grow with the number of metrics: it keeps the new vectors and published values and counts
the call. A metric whose state changes outside the step (a reset at EPOCH_STARTED) leaves the carry and
marks it stale, and the next call packs every metric's state again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ember.training._packing import StatePacking


class Carry:
    """One layout's packed accumulators as the last compiled call left them; metrics read their part here.

    Attributes:
        packing: the layout.
        packed: the vectors (device arrays, donated to the next call), or ``None`` before the first pack.
        published: per metric, the value it publishes every step (computed in the call), or ``None``;
            with K steps per call, a tuple of K values, one per step.
        slot: with K steps per call, the step within the call that the engine's iteration is at (which of
            the K published values is current); ``None`` with one step per call.
        calls: compiled calls made with this carry; a metric compares it with the call it last read.
        stale: a metric's state changed outside the step; the next call packs the states again.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.training._fused import Carry
        >>> from ember.training._packing import StatePacking
        >>> carry = Carry(StatePacking([(jnp.array(1.0), jnp.array(2))]))
        >>> carry.stale, carry.calls, carry.packed is None
        (True, 0, True)
    """

    __slots__ = ("calls", "packed", "packing", "published", "slot", "stale")

    def __init__(self, packing: StatePacking) -> None:
        self.packing = packing
        self.packed: tuple[jax.Array, ...] | None = None
        self.published: tuple[Any, ...] = ()
        self.slot: int | None = None
        self.calls = 0
        self.stale = True

    def read(self, index: int) -> Any:
        """Metric ``index``'s accumulators from the current vectors (one small compiled call)."""
        assert self.packed is not None
        return self.packing.unpack_one(self.packed, index)


class FusedMetrics:
    """The metrics whose updates a training engine runs inside its compiled step.

    ``version`` changes with every metric added or removed; the engine compiles one step per version
    (:meth:`wrap`) and calls it with :meth:`call`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import Sum
        >>> from ember.training._fused import FusedMetrics
        >>> fused, total = FusedMetrics(), Sum()
        >>> undo = fused.add(total)
        >>> step = jax.jit(fused.wrap(lambda state, batch: (state + 1, batch)))
        >>> state, out = fused.call(step, jnp.array(0), jnp.array([1.0, 2.0]))
        >>> state, out = fused.call(step, state, jnp.array([3.0]))
        >>> int(state), total.compute()
        (2, 6.0)
    """

    def __init__(self) -> None:
        self.metrics: list[Any] = []
        self.version = 0
        self._carry: Carry | None = None
        self._carry_version = -1

    def add(self, metric: Any) -> Callable[[], None]:
        """Fold ``metric``'s update into the step from the next compilation on; returns how to undo it."""
        self.metrics.append(metric)
        self.version += 1

        def undo() -> None:
            if any(m is metric for m in self.metrics):
                self.metrics = [m for m in self.metrics if m is not metric]
                self.version += 1

        return undo

    def wrap(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """``step`` as a step over ``((state, packed), batch)`` that also updates the metrics.

        ``step(state, batch) -> (state, out)`` becomes ``fused((state, packed), batch) -> ((state, packed),
        (out, published))``.

        The accumulators are unpacked inside the step, updated and packed again; a metric that publishes
        a value every step (a running average) returns it beside the output.
        """
        if self._carry_version != self.version:  # one layout per set of metrics
            self._carry = Carry(StatePacking([m.state for m in self.metrics]))
            self._carry_version = self.version
        packing, metrics = self._carry.packing, list(self.metrics)  # type: ignore[union-attr]

        def fused(carry: Any, batch: Any) -> Any:
            state, packed = carry
            state, out = step(state, batch)
            new, published = _update_all(metrics, packing.unpack(packed), out)
            return (state, packing._pack(new)), (out, published)

        return fused

    def split_published(self, fn: Callable[..., Any], size: int) -> Callable[..., Any]:
        """``fn``, K = ``size`` fused steps per call, with each published value split into K outputs.

        The iteration at step i then publishes step i's value without a dispatch of its own.
        """

        def split(carry: Any, group: Any) -> Any:
            carry, (out, published) = fn(carry, group)
            per_step = tuple(
                None if p is None else tuple(jax.tree.map(lambda x, i=i: x[i], p) for i in range(size))
                for p in published
            )
            return carry, (out, per_step)

        return split

    def at_step(self, slot: int) -> None:
        """The engine's iteration is at step ``slot`` of a K-step call (see :attr:`Carry.slot`)."""
        if self._carry is not None:
            self._carry.slot = slot

    def call(self, fn: Callable[..., Any], state: Any, batch: Any) -> tuple[Any, Any]:
        """Run ``fn`` (compiled from :meth:`wrap`) on ``state`` and ``batch``; returns ``(state, out)``."""
        carry = self._carry
        assert carry is not None  # set by wrap, which compiled fn
        if carry.stale:
            self._pack(carry)
        (state, carry.packed), (out, carry.published) = fn((state, carry.packed), batch)
        carry.calls += 1
        return state, out

    def _pack(self, carry: Carry) -> None:
        """Pack every metric's current state into ``carry``, and move the metrics' states there."""
        states = tuple(m.state for m in self.metrics)
        carry.packed = carry.packing.pack(states)
        carry.published = (None,) * len(states)
        for index, metric in enumerate(self.metrics):
            metric._enter_carry(carry, index)
        carry.stale = False


def _tied(states: Any, out: Any) -> Any:
    """``states`` unchanged in value, but made to depend on ``out`` (any pytree with a float leaf).

    XLA:CPU's runtime runs independent branches of a computation concurrently, and on a 2-core machine
    such a branch costs about 30-60 us of thread hand-off: an accumulator whose update depends only on
    shapes (an example count, a sum of ones) is one. Multiplying by
    ``(v == v) | (v != v)``, which is 1 for every float ``v`` (NaN and inf included) and which XLA cannot
    fold for floats, orders the work without changing a value (measurements in docs/benchmarks.md).
    """
    anchors = [x for x in jax.tree.leaves(out) if jnp.issubdtype(jnp.result_type(x), jnp.floating)]
    if not anchors:
        return states
    v = jnp.ravel(anchors[0])[0]
    one = (v == v) | (v != v)

    def tie(leaf: Any) -> Any:
        return leaf & one if leaf.dtype == jnp.bool_ else leaf * one.astype(leaf.dtype)

    return jax.tree.map(tie, states)


def _update_all(metrics: list[Any], states: tuple[Any, ...], out: Any) -> tuple[Any, Any]:
    """Every fused metric's update from ``out``, and what each publishes per step, tied to ``out``.

    The new accumulators are donated to the next call with the train state (donation measured 15-20%
    faster on XLA:CPU), so a value a metric publishes every step (a running average) leaves the call as
    an output of its own, which is not donated and stays readable for handlers that read late.
    """
    new = tuple(m.fused_update(s, out) for m, s in zip(metrics, states, strict=True))
    published = tuple(m.published_value(s) for m, s in zip(metrics, new, strict=True))
    return _tied((new, published), out)  # see _tied
