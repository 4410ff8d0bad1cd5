"""Regression metrics: `MeanSquaredError`, `MeanAbsoluteError`, `RootMeanSquaredError`."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ember.metrics._mean import MeanMetric, broadcast_weights


class _MeanError(MeanMetric):
    def _errors(self, diff: Any) -> Any:
        raise NotImplementedError

    def batch_state(self, y_pred: Any, y: Any, mask: Any = None) -> Any:
        y_pred, y = jnp.asarray(y_pred, jnp.float32), jnp.asarray(y, jnp.float32)
        errors = self._errors(y_pred - y)
        w = broadcast_weights(errors, mask)
        return (jnp.sum(errors * w), jnp.sum(w))


class MeanSquaredError(_MeanError):
    """The mean of squared errors over all elements (masked examples excluded).

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import MeanSquaredError
        >>> mse = MeanSquaredError()
        >>> mse.update((jnp.array([1.0, 2.0]), jnp.array([0.0, 0.0])))
        >>> mse.compute()
        2.5
    """

    def _errors(self, diff: Any) -> Any:
        return diff**2


class MeanAbsoluteError(_MeanError):
    """The mean of absolute errors over all elements (masked examples excluded).

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import MeanAbsoluteError
        >>> mae = MeanAbsoluteError()
        >>> mae.update((jnp.array([1.0, -2.0]), jnp.array([0.0, 0.0])))
        >>> mae.compute()
        1.5
    """

    def _errors(self, diff: Any) -> Any:
        return jnp.abs(diff)


class RootMeanSquaredError(MeanSquaredError):
    """The square root of [`MeanSquaredError`][ember.metrics.MeanSquaredError].

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import RootMeanSquaredError
        >>> rmse = RootMeanSquaredError()
        >>> rmse.update((jnp.array([3.0, 4.0]), jnp.array([0.0, 0.0])))
        >>> round(rmse.compute(), 4)
        3.5355
    """

    def finalize(self, state: Any) -> Any:
        return jnp.sqrt(state[0] / state[1])
