"""The shape shared by mean-like metrics: a weighted total and a count, finalised as their ratio."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ember.metrics._metric import Metric


def broadcast_weights(values: Any, mask: Any) -> Any:
    """Float weights shaped like ``values``: a per-example (or same-shape) mask spread over the rest, or ones."""
    if mask is None:
        return jnp.ones_like(values)
    mask = jnp.asarray(mask, jnp.float32)
    return jnp.broadcast_to(mask.reshape(mask.shape + (1,) * (values.ndim - mask.ndim)), values.shape)


def mean_accumulators() -> Any:
    """A mean's accumulators before any update: ``(weighted total, count)``, both 0."""
    return (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))


def mean_of(state: Any) -> Any:
    """A mean's value from its accumulators: total over count."""
    return state[0] / state[1]


class MeanMetric(Metric):
    """A metric whose accumulators are ``(weighted total, count)`` and whose value is their ratio."""

    def empty(self) -> Any:
        return mean_accumulators()

    def finalize(self, state: Any) -> Any:
        return mean_of(state)
