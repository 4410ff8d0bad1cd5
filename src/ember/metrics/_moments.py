"""Metrics built on mergeable moments: `Std` and `R2Score` (Chan's parallel variance)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from ember.metrics._metric import Metric
from ember.metrics._reductions import _Reduction


def moments(x: Any, w: Any) -> tuple[Any, Any, Any]:
    """``(count, mean, M2)`` of ``x`` with weights ``w`` (0/1)."""
    n = jnp.sum(w)
    mean = jnp.sum(x * w) / jnp.maximum(n, 1.0)
    return n, mean, jnp.sum(w * (x - mean) ** 2)


def merge_moments(a: tuple[Any, Any, Any], b: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    """Chan et al.'s combination of two ``(count, mean, M2)``: exact, and stable in float32."""
    na, ma, m2a = a
    nb, mb, m2b = b
    n = na + nb
    delta = mb - ma
    safe = jnp.maximum(n, 1.0)
    return n, ma + delta * nb / safe, m2a + m2b + delta**2 * na * nb / safe


class Std(_Reduction):
    """The population standard deviation (``ddof=0``, as ``numpy.std``) of all values seen.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import Std
        >>> std = Std()
        >>> std.update(jnp.array([1.0, 2.0])); std.update(jnp.array([3.0, 4.0]))
        >>> round(std.compute(), 6)
        1.118034
    """

    def empty(self) -> Any:
        zero = jnp.zeros((), jnp.float32)
        return (zero, zero, zero)

    def batch_state(self, value: Any, mask: Any = None) -> Any:
        return moments(*self._values(value, mask))

    def merge(self, a: Any, b: Any) -> Any:
        return merge_moments(a, b)

    def finalize(self, state: Any) -> Any:
        n, _, m2 = state
        return jnp.sqrt(m2 / n)


class R2Score(Metric):
    """The coefficient of determination, ``1 - SS_res / SS_tot``, over all elements seen.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import R2Score
        >>> r2 = R2Score()
        >>> r2.update((jnp.array([2.5, 0.0, 2.0, 8.0]), jnp.array([3.0, -0.5, 2.0, 7.0])))
        >>> round(r2.compute(), 4)
        0.9486
    """

    def __init__(
        self, output_transform: Callable[[Any], Any] | None = None, *, mask_key: str | None = "mask", device: Any = None
    ) -> None:
        super().__init__(output_transform, device, mask_key=mask_key)

    def empty(self) -> Any:
        zero = jnp.zeros((), jnp.float32)
        return ((zero, zero, zero), zero)

    def batch_state(self, y_pred: Any, y: Any, mask: Any = None) -> Any:
        y_pred, y = jnp.asarray(y_pred, jnp.float32), jnp.asarray(y, jnp.float32)
        w = (
            jnp.ones_like(y)
            if mask is None
            else jnp.broadcast_to(
                jnp.asarray(mask, jnp.float32).reshape(jnp.shape(mask) + (1,) * (y.ndim - jnp.ndim(mask))), y.shape
            )
        )
        return moments(y, w), jnp.sum(w * (y - y_pred) ** 2)

    def merge(self, a: Any, b: Any) -> Any:
        return merge_moments(a[0], b[0]), a[1] + b[1]

    def finalize(self, state: Any) -> Any:
        (_, _, ss_tot), ss_res = state
        return 1.0 - ss_res / ss_tot
