"""`FusedMetrics`: the metric updates a training engine folds into its compiled step, and their carry.

A fused metric's accumulators do not live in the metric while the engine runs: they travel through the
compiled call packed (:class:`StatePacking`, one vector of words per byte width) in a :class:`Carry`,
and the metric reads its part back only when something asks for its state. The host's work per call
does not grow with the number of metrics: it keeps the new vectors and published values and counts
the call. A metric whose state changes outside the step (a reset at EPOCH_STARTED) leaves the carry and
marks it stale, and the next call packs every metric's state again.

On GPU, a value a metric publishes every step (a running average, in ``state.metrics``) is donated
back to the next call, which writes the new value into the same buffer, unless something besides the
engine still holds it (:func:`_unshared`). XLA:GPU runs the step as a CUDA graph and updates the graph
(about 40 us of host time on an H100 machine) on every call in which an output lands at a new address,
as a fresh output buffer must while the last one is still alive; reusing the buffer keeps the graph
as it is. XLA:CPU has no such graph, and there the extra parameter and the check cost about 3 us a
step, so it keeps a fresh output (measurements in docs/benchmarks.md).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ember.training._packing import StatePacking


class Carry:
    """One layout's packed accumulators as the last compiled call left them; metrics read their part here.

    Attributes:
        packing: the layout.
        packed: the vectors (device arrays, donated to the next call), or ``None`` before the first pack.
        published: per metric, the value it publishes every step (computed in the call), or ``None``;
            with K steps per call, a tuple of K values, one per step.
        donor: per metric, the buffer the next call writes its published value into (donated to it):
            the last call's published value; empty unless published values are reused (see
            :meth:`FusedMetrics.wrap`).
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

    __slots__ = ("calls", "donor", "packed", "packing", "published", "slot", "stale")

    def __init__(self, packing: StatePacking) -> None:
        self.packing = packing
        self.packed: tuple[jax.Array, ...] | None = None
        self.published: tuple[Any, ...] = ()
        self.donor: tuple[Any, ...] = ()
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
        self._names: list[Sequence[str]] = []
        self.version = 0
        self._carry: Carry | None = None
        self._start: Callable[..., Any] = lambda states: ((), ())  # packs, and the first published values
        self._key: tuple[int, bool] = (-1, False)  # (version, reuse) that the carry and _start were made for
        self._spares: dict[int, list[Any]] = {}  # by metric index: fresh buffers for published values
        self.reuse_published: bool | None = None  # None: on GPU only (see wrap)

    def add(self, metric: Any, names: Sequence[str] = ()) -> Callable[[], None]:
        """Fold ``metric``'s update into the step from the next compilation on; returns how to undo it.

        ``names``: where the metric puts the value it publishes every step in ``state.metrics`` (a live
        sequence: names added later count); see :meth:`call`.
        """
        self.metrics.append(metric)
        self._names.append(names)
        self.version += 1

        def undo() -> None:
            for i in [i for i, m in enumerate(self.metrics) if m is metric][::-1]:
                del self.metrics[i], self._names[i]
                self.version += 1

        return undo

    def wrap(self, step: Callable[..., Any], *, stacked: bool = False, platform: str = "cpu") -> Callable[..., Any]:
        """``step`` as a step over ``((state, packed, last), batch)`` that also updates the metrics.

        ``step(state, batch) -> (state, out)`` becomes ``fused((state, packed, last), batch) -> ((state,
        packed, last), (out, published))``: the accumulators are unpacked inside the step, updated and
        packed again, and each metric that publishes a value every step (a running average) returns it
        in ``published`` (with ``stacked``, K steps per call scanned, one per step).

        On GPU (``platform``, or :attr:`reuse_published` when set) with one step per call, published
        values travel in the carry instead (``last``, ``out`` alone beside it), each written into the
        buffer of the value published last; see :meth:`call`.
        """
        reuse = not stacked and (self.reuse_published if self.reuse_published is not None else platform == "gpu")
        metrics = tuple(self.metrics)
        if self._key != (self.version, reuse):  # one layout per set of metrics
            packing = StatePacking([m.state for m in metrics])
            self._carry, self._key, self._spares = Carry(packing), (self.version, reuse), {}
            self._start = jax.jit(lambda states: (packing._pack(states), _published(metrics, states) if reuse else ()))
        packing = self._carry.packing  # type: ignore[union-attr]

        def fused(carry: Any, batch: Any) -> Any:
            state, packed, last = carry
            state, out = step(state, batch)
            new, published = _update_all(metrics, packing.unpack(packed), out)
            if not reuse:
                return (state, packing._pack(new), ()), (out, published)
            # The last values come in only to give their buffers; a use keeps them as parameters (jit
            # drops unused ones), and XLA folds it away.
            published = jax.tree.map(
                lambda p, q: lax.select(True, lax.convert_element_type(p, q.dtype), q), published, last
            )
            return (state, packing._pack(new), published), out

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

    def call(
        self, fn: Callable[..., Any], state: Any, batch: Any, held: Mapping[str, Any] | None = None
    ) -> tuple[Any, Any]:
        """Run ``fn`` (compiled from :meth:`wrap`) on ``state`` and ``batch``; returns ``(state, out)``.

        ``held``: the engine's ``state.metrics``, when ``fn`` donates its carry. Where published values
        are reused, one held anywhere but there (under the metric's own names) and in the carry is not
        donated: a fresh buffer goes in its place, so a handler may keep any value it reads.
        """
        carry = self._carry
        assert carry is not None  # set by wrap, which compiled fn
        if carry.stale:
            self._pack(carry, state)
        donor = carry.donor
        if held is not None and donor:
            shared = [i for i, names in enumerate(self._names) if names and not _unshared(donor, i, held, names)]
            if shared:
                given = list(donor)
                for i in shared:
                    given[i] = self._spare(i, given[i])
                donor = tuple(given)
        (state, carry.packed, carry.donor), out = fn((state, carry.packed, donor), batch)
        if self._key[1]:  # published values reused: they came back in the carry
            carry.published = carry.donor
        else:
            out, carry.published = out
        carry.calls += 1
        return state, out

    def _spare(self, index: int, like: Any) -> Any:
        """A fresh buffer shaped like metric ``index``'s published value, for a call that must not take it.

        Made 16 at a time (one dispatch), so a handler that keeps every value costs no dispatch per step.
        """
        pool = self._spares.setdefault(index, [])
        if not pool:
            pool.extend(_copies(like))
        return pool.pop()

    def _pack(self, carry: Carry, like: Any) -> None:
        """Pack every metric's current state into ``carry``, and move the metrics' states there.

        The vectors are placed as the train state ``like`` is: packed from fresh (uncommitted) arrays they
        would be uncommitted, the step's outputs are not, and the step would compile a second time for
        its second call (about a second for the digits CNN on CPU).
        """
        states = tuple(m.state for m in self.metrics)
        leaves = jax.tree.leaves(like)
        placed = self._start(states)
        if leaves and isinstance(leaves[0], jax.Array) and leaves[0].is_fully_addressable:
            placed = jax.device_put(placed, leaves[0].sharding)  # (across processes, the step places them)
        carry.packed, carry.donor = placed
        carry.published = (None,) * len(states)
        for index, metric in enumerate(self.metrics):
            metric._enter_carry(carry, index)
        carry.stale = False


def _refs(parent: Any, key: Any) -> int:
    return sys.getrefcount(parent[key])


_TEMPORARY = _refs([object()], 0) - 1  # what sys.getrefcount counts in _refs besides real holders


def _unshared(parent: Any, key: Any, held: Mapping[str, Any], names: Sequence[str]) -> bool:
    """Whether ``parent[key]`` is referenced only by ``parent`` and by ``held`` under ``names``.

    Then donating it to the next call deletes nothing that anyone reads later: the engine puts the new
    value under those names before any handler runs. Reference counts decide, so a handler that keeps
    ``engine.state.metrics["running_loss"]`` (in a list, under another name) keeps it valid. A pytree
    value counts when its inner nodes and leaves are held by their parents alone.
    """
    if parent[key] is None:
        return True  # nothing to donate
    if _refs(parent, key) - _TEMPORARY - 1 != sum(held.get(name) is parent[key] for name in names):
        return False
    value = parent[key]
    if isinstance(value, jax.Array):
        return True
    if isinstance(value, tuple | list):
        return all(_unshared(value, i, {}, ()) for i in range(len(value)))
    if isinstance(value, dict):
        return all(_unshared(value, k, {}, ()) for k in value)
    return False


@jax.jit
def _copies(value: Any) -> tuple[Any, ...]:
    """16 separate buffers holding ``value`` (and placed as it is): spares for :meth:`FusedMetrics.call`."""
    return tuple(jax.tree.map(jnp.copy, value) for _ in range(16))


def _published(metrics: tuple[Any, ...], states: tuple[Any, ...]) -> tuple[Any, ...]:
    """Each metric's published value of ``states`` (``None`` for metrics that publish nothing), strongly typed.

    The step converts its published values to these types, so the buffers given back match exactly.
    """
    values = tuple(m.published_value(s) for m, s in zip(metrics, states, strict=True))
    return jax.tree.map(lambda v: lax.convert_element_type(v, v.dtype), values)


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


def _update_all(metrics: Sequence[Any], states: tuple[Any, ...], out: Any) -> tuple[Any, Any]:
    """Every fused metric's update from ``out``, and what each publishes per step, tied to ``out``.

    The new accumulators are donated to the next call with the train state (donation measured 15-20%
    faster on XLA:CPU); a value a metric publishes every step (a running average) leaves the call as a
    value of its own, which handlers read from ``state.metrics`` and may keep (see :meth:`FusedMetrics.call`).
    """
    new = tuple(m.fused_update(s, out) for m, s in zip(metrics, states, strict=True))
    published = tuple(m.published_value(s) for m, s in zip(metrics, new, strict=True))
    return _tied((new, published), out)  # see _tied
