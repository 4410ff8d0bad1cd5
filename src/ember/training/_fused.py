"""`FusedMetrics`: the metric updates a training engine folds into its compiled step.

The contract with a metric (see [`ember.metrics.Metric`][ember.metrics.Metric], "Updates inside a compiled step") is
small: the metric owns its accumulators (``metric.state``) and gives the pure update ``fused_update(state, output)``
and, optionally, a value it publishes every step (``published_value(state)``, a running average). Each compiled call
takes every fused metric's state as a plain tuple next to the train state, donates both, and hands the new states (and
published values) back with ``metric.set_state``. A metric whose state changed between calls (a reset at EPOCH_STARTED,
a restore) needs nothing more: the next call reads it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import jax

from ember.training._devices.placement import place


class FusedMetrics:
    """The metrics whose updates a training engine runs inside its compiled step.

    ``version`` changes with every metric added or removed; the engine compiles one step per version
    (`wrap`) and calls it with `call`.

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
        self._given: tuple[Any, ...] = ()  # the states the last call gave back, to notice changes between calls
        self._last: tuple[tuple[Any, ...], tuple[Any, ...]] = ((), ())  # a K-step call's (states, per-step values)

    def add(self, metric: Any) -> Callable[[], None]:
        """Fold ``metric``'s update into the step from the next compilation on; returns how to undo it."""
        self.metrics.append(metric)
        self.version += 1

        def undo() -> None:
            if metric in self.metrics:
                self.metrics.remove(metric)
                self.version += 1

        return undo

    def wrap(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """``step(state, batch) -> (state, out)`` as a step that also updates the metrics.

        The result is ``fused((state, states), batch) -> ((state, states), (out, published))``: ``states``
        holds each metric's accumulators, ``published`` each metric's published value of the new
        accumulators (``None`` for a metric that publishes none).
        """
        metrics = tuple(self.metrics)

        def fused(carry: Any, batch: Any) -> Any:
            state, states = carry
            state, out = step(state, batch)
            new = tuple(m.fused_update(s, out) for m, s in zip(metrics, states, strict=True))
            published = tuple(m.published_value(s) for m, s in zip(metrics, new, strict=True))
            return (state, new), (out, published)

        return fused

    def split_published(self, fn: Callable[..., Any], size: int) -> Callable[..., Any]:
        """``fn``, K = ``size`` fused steps per call, with each stacked published value split into K outputs.

        Iteration i of the call then publishes step i's value without a dispatch of its own.
        """

        def split(carry: Any, group: Any) -> Any:
            carry, (out, published) = fn(carry, group)
            per_step = tuple(
                None if p is None else tuple(jax.tree.map(lambda x, i=i: x[i], p) for i in range(size))
                for p in published
            )
            return carry, (out, per_step)

        return split

    def call(self, fn: Callable[..., Any], state: Any, batch: Any, *, steps: int = 1) -> tuple[Any, Any]:
        """Run ``fn`` (compiled from `wrap`) on ``state`` and ``batch``; returns ``(state, out)``.

        With ``steps`` = K > 1 (``fn`` from `split_published`), the metrics get their states step
        by step from `give`.
        """
        metrics = self.metrics
        states = tuple([m.state for m in metrics])
        if len(states) != len(self._given) or not all(map(operator.is_, states, self._given)):
            states = _placed_like(states, state)  # changed between calls (created, reset, restored)
        (state, states), (out, published) = fn((state, states), batch)
        self._given = states
        if steps == 1:
            for metric, new, value in zip(metrics, states, published, strict=True):
                metric.set_state(new, value)
        else:
            self._last = (states, published)
        return state, out

    def give(self, slot: int) -> None:
        """Step ``slot`` of the last K-step call: each metric takes the call's state and that step's published value."""
        states, published = self._last
        for metric, new, value in zip(self.metrics, states, published, strict=True):
            metric.set_state(new, None if value is None else value[slot])


def _placed_like(states: tuple[Any, ...], state: Any) -> tuple[Any, ...]:
    """``states`` placed as the train state's first leaf (its replicated step counter) is.

    Fresh accumulators are uncommitted arrays and the step's outputs are not: without this the step
    would compile a second time for its second call (about a second for the digits CNN on CPU). Across
    processes they become global arrays, replicated on the train state's mesh.
    """
    leaves = jax.tree.leaves(state)
    if not leaves or not isinstance(leaves[0], jax.Array):
        return states
    sharding = leaves[0].sharding
    if jax.process_count() == 1:
        return jax.device_put(states, sharding)  # every leaf in one call
    return jax.tree.map(lambda x: place(x, sharding), states)
