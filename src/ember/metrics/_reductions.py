"""Reductions over an output: `Average`, `Sum`, `Min`, `Max`, and `Loss`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp

from ember.metrics._mean import MeanMetric, broadcast_weights, mean_accumulators, mean_of
from ember.metrics._metric import Metric


class _Reduction(Metric):
    """A reduction of one value from the output: the whole output, or ``output[key]``."""

    def __init__(
        self,
        key: str | None = None,
        output_transform: Callable[[Any], Any] | None = None,
        *,
        mask_key: str | None = "mask",
        device: Any = None,
    ) -> None:
        self.keys = (key,) if key is not None else ("value",)
        self._key = key
        super().__init__(output_transform, device, mask_key=mask_key)

    def arguments(self, output: Any) -> tuple[tuple[Any, ...], Any]:
        if self._key is None and self._output_transform is None and isinstance(output, Mapping):
            raise KeyError(
                f"{type(self).__name__} got a mapping output with keys {sorted(output)}; say which value to use "
                f"with {type(self).__name__}(key='loss') or output_transform=."
            )
        return super().arguments(output)

    @staticmethod
    def _values(value: Any, mask: Any) -> tuple[jnp.ndarray, jnp.ndarray]:
        value = jnp.asarray(value, jnp.float32)
        return value, broadcast_weights(value, mask)


class Average(_Reduction):
    """The mean of the values seen, weighted by how many there are.

    A per-example array counts each element, a scalar counts once. Masked elements do not count.

    Args:
        key: the output entry to average (e.g. ``"loss"``); ``None`` takes the whole output.
        output_transform: maps the output to the value instead.
        mask_key: the output entry holding a mask.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import Average
        >>> avg = Average()
        >>> avg.update(jnp.array([1.0, 2.0, 3.0])); avg.update(jnp.array([10.0]))
        >>> avg.compute()
        4.0
    """

    def empty(self) -> Any:
        return mean_accumulators()

    def batch_state(self, value: Any, mask: Any = None) -> Any:
        v, w = self._values(value, mask)
        return (jnp.sum(v * w), jnp.sum(w))

    def finalize(self, state: Any) -> Any:
        return mean_of(state)


class Sum(_Reduction):
    """The sum of all values seen (masked elements excluded).

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import Sum
        >>> s = Sum(key="value")
        >>> s.update({"value": jnp.array([1.0, 2.0]), "mask": jnp.array([1, 0])})
        >>> s.compute()
        1.0
    """

    def empty(self) -> Any:
        return jnp.zeros((), jnp.float32)

    def batch_state(self, value: Any, mask: Any = None) -> Any:
        v, w = self._values(value, mask)
        return jnp.sum(v * w)

    def finalize(self, state: Any) -> Any:
        return state


class Min(_Reduction):
    """The smallest value seen (masked elements excluded).

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import Min
        >>> m = Min()
        >>> m.update(jnp.array([3.0, 1.5])); m.update(jnp.array([2.0]))
        >>> m.compute()
        1.5
    """

    def empty(self) -> Any:
        return jnp.full((), jnp.inf, jnp.float32)

    def batch_state(self, value: Any, mask: Any = None) -> Any:
        v, w = self._values(value, mask)
        return jnp.min(jnp.where(w > 0, v, jnp.inf))

    def merge(self, a: Any, b: Any) -> Any:
        return jnp.minimum(a, b)

    def finalize(self, state: Any) -> Any:
        return state


class Max(_Reduction):
    """The largest value seen (masked elements excluded).

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import Max
        >>> m = Max()
        >>> m.update(jnp.array([3.0, 1.5])); m.update(jnp.array([2.0]))
        >>> m.compute()
        3.0
    """

    def empty(self) -> Any:
        return jnp.full((), -jnp.inf, jnp.float32)

    def batch_state(self, value: Any, mask: Any = None) -> Any:
        v, w = self._values(value, mask)
        return jnp.max(jnp.where(w > 0, v, -jnp.inf))

    def merge(self, a: Any, b: Any) -> Any:
        return jnp.maximum(a, b)

    def finalize(self, state: Any) -> Any:
        return state


class Loss(MeanMetric):
    """The average of ``loss_fn(y_pred, y)`` over examples, as Ignite's ``Loss``.

    ``loss_fn`` returns one loss per example (or a per-batch mean, which then counts once per example of
    the batch); masked examples do not count.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import Loss
        >>> loss = Loss(lambda y_pred, y: (y_pred - y) ** 2)
        >>> loss.update({"y_pred": jnp.array([1.0, 2.0]), "y": jnp.array([1.0, 0.0])})
        >>> loss.compute()
        2.0
    """

    def __init__(
        self,
        loss_fn: Callable[[Any, Any], Any],
        output_transform: Callable[[Any], Any] | None = None,
        *,
        mask_key: str | None = "mask",
        device: Any = None,
    ) -> None:
        if not callable(loss_fn):
            raise TypeError(f"`loss_fn` must be callable as loss_fn(y_pred, y), got {loss_fn!r}.")
        self.loss_fn = loss_fn
        super().__init__(output_transform, device, mask_key=mask_key)

    def batch_state(self, y_pred: Any, y: Any, mask: Any = None) -> Any:
        n = jnp.shape(y)[0]
        losses = jnp.broadcast_to(jnp.asarray(self.loss_fn(y_pred, y), jnp.float32), (n,))
        w = jnp.ones((n,), jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32)
        return (jnp.sum(losses * w), jnp.sum(w))


class Perplexity(Average):
    """``exp`` of the mean token loss: the perplexity of a language model, with padding masked out.

    The value (``output[key]``) holds per-token negative log-likelihoods, and the mask, if any, marks the
    real tokens with the same shape.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import Perplexity
        >>> ppl = Perplexity(key="token_loss")
        >>> ppl.update({"token_loss": jnp.array([[1.0, 3.0], [2.0, 9.0]]), "mask": jnp.array([[1, 1], [1, 0]])})
        >>> round(ppl.compute(), 4)
        7.3891
    """

    def finalize(self, state: Any) -> Any:
        total, count = state
        return jnp.exp(total / count)
