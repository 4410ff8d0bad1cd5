"""Arithmetic between metrics: `MetricsLambda`, a lazy metric computed from others."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ember.engine import Engine
    from ember.metrics._usage import MetricUsage


class AttachedMetric:
    """What attaching a metric returns: ``remove()`` detaches it from the engine under that name.

    ``remove()`` is idempotent, and the handle is a context manager that detaches on exit. For a composite
    metric it also detaches the parts nothing else uses.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember import Engine
        >>> from ember.metrics import Average
        >>> engine, avg = Engine(lambda engine, batch: jnp.asarray(batch, jnp.float32)), Average()
        >>> with avg.attach(engine, "mean"):
        ...     _ = engine.run([[1.0, 3.0]])
        >>> avg.is_attached(engine)
        False
    """

    def __init__(self, undo: Callable[[], None]) -> None:
        self._undo: Callable[[], None] | None = undo

    def remove(self) -> None:
        """Detach; nothing happens the second time."""
        undo, self._undo = self._undo, None
        if undo is not None:
            undo()

    def __enter__(self) -> AttachedMetric:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class MetricArithmetic:
    """Operators shared by metrics and composite metrics: each builds a ``MetricsLambda``."""

    def __add__(self, other: Any) -> MetricsLambda:
        return MetricsLambda(operator.add, self, other)

    def __radd__(self, other: Any) -> MetricsLambda:
        return MetricsLambda(operator.add, other, self)

    def __sub__(self, other: Any) -> MetricsLambda:
        return MetricsLambda(operator.sub, self, other)

    def __rsub__(self, other: Any) -> MetricsLambda:
        return MetricsLambda(operator.sub, other, self)

    def __mul__(self, other: Any) -> MetricsLambda:
        return MetricsLambda(operator.mul, self, other)

    def __rmul__(self, other: Any) -> MetricsLambda:
        return MetricsLambda(operator.mul, other, self)

    def __truediv__(self, other: Any) -> MetricsLambda:
        return MetricsLambda(operator.truediv, self, other)

    def __rtruediv__(self, other: Any) -> MetricsLambda:
        return MetricsLambda(operator.truediv, other, self)

    def __floordiv__(self, other: Any) -> MetricsLambda:
        return MetricsLambda(operator.floordiv, self, other)

    def __rfloordiv__(self, other: Any) -> MetricsLambda:
        return MetricsLambda(operator.floordiv, other, self)

    def __pow__(self, other: Any) -> MetricsLambda:
        return MetricsLambda(operator.pow, self, other)

    def __rpow__(self, other: Any) -> MetricsLambda:
        return MetricsLambda(operator.pow, other, self)

    def __mod__(self, other: Any) -> MetricsLambda:
        return MetricsLambda(operator.mod, self, other)

    def __neg__(self) -> MetricsLambda:
        return MetricsLambda(operator.neg, self)

    def __abs__(self) -> MetricsLambda:
        return MetricsLambda(operator.abs, self)

    def __getitem__(self, index: Any) -> MetricsLambda:
        return MetricsLambda(operator.getitem, self, index)

    def __getattr__(self, name: str) -> Callable[..., MetricsLambda]:
        # ``metric.mean()``, ``metric.sum(axis=0)``: method calls on the computed (NumPy) value.
        if name.startswith("_") or not hasattr(np.ndarray, name):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

        def call(*args: Any, **kwargs: Any) -> MetricsLambda:
            return MetricsLambda(
                lambda value, *a, **k: getattr(np.asarray(value), name)(*a, **k), self, *args, **kwargs
            )

        return call

    # The interface composite metrics rely on; Metric implements it.
    def compute(self) -> Any:
        """The value."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the accumulated batches."""
        raise NotImplementedError

    def update(self, output: Any) -> None:
        """Merge one batch."""
        raise NotImplementedError

    def _attach_internal(self, engine: Engine, usage: MetricUsage, key: str) -> None:
        raise NotImplementedError

    def _release_internal(self, engine: Engine) -> None:
        raise NotImplementedError


class MetricsLambda(MetricArithmetic):
    """A metric computed by ``fn`` from other metrics' values (and constants), built by arithmetic.

    Attaching it attaches the metrics it depends on without names, so only its own name lands in
    ``engine.state.metrics``; each dependency still updates once per iteration however often it appears.

    Args:
        fn: combines the computed values.
        *args: metrics or constants, passed positionally to ``fn``.
        **kwargs: metrics or constants, passed by keyword.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember import Engine
        >>> from ember.metrics import Precision, Recall
        >>> precision, recall = Precision(), Recall()
        >>> f1 = 2 * precision * recall / (precision + recall)
        >>> engine = Engine(lambda e, batch: batch)
        >>> _ = f1.attach(engine, "f1")
        >>> out = {"y_pred": jnp.array([1.0, 1.0, 0.0, 0.0]), "y": jnp.array([1, 0, 1, 1])}
        >>> state = engine.run([out])
        >>> list(state.metrics), round(state.metrics["f1"], 4)
        (['f1'], 0.4)
    """

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if not callable(fn):
            raise TypeError(f"`fn` must be callable, got {fn!r}.")
        self.fn = fn
        self.args = args
        self.kwargs = kwargs

    def _dependencies(self) -> list[MetricArithmetic]:
        seen: list[MetricArithmetic] = []
        for m in (*self.args, *self.kwargs.values()):
            if isinstance(m, MetricArithmetic) and all(m is not s for s in seen):
                seen.append(m)
        return seen

    def compute(self) -> Any:
        """Compute the dependencies and combine them.

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember.metrics import Sum
            >>> total = Sum()
            >>> total.update(jnp.array([2.0, 4.0]))
            >>> (total / 2 + 1).compute()
            4.0
        """

        def value(x: Any) -> Any:
            return x.compute() if isinstance(x, MetricArithmetic) else x

        return self.fn(*(value(a) for a in self.args), **{k: value(v) for k, v in self.kwargs.items()})

    def reset(self) -> None:
        """Reset every dependency.

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember.metrics import Sum
            >>> total = Sum()
            >>> double = total * 2
            >>> total.update(jnp.array([1.0])); double.reset(); total.update(jnp.array([3.0]))
            >>> double.compute()
            6.0
        """
        for m in self._dependencies():
            m.reset()

    def update(self, output: Any) -> None:
        """Update every dependency once with ``output``.

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember.metrics import Sum
            >>> total = Sum()
            >>> (total + total).update(jnp.array([1.0, 2.0]))
            >>> total.compute()
            3.0
        """
        for m in self._dependencies():
            m.update(output)

    def attach(self, engine: Engine, name: str, usage: Any = "epoch_wise") -> AttachedMetric:
        """Attach the dependencies (unnamed) and write only ``engine.state.metrics[name]``; return the handle.

        ``remove()`` on the handle stops writing ``name`` and detaches the dependencies nothing else uses.

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember import Engine
            >>> from ember.metrics import Sum
            >>> engine = Engine(lambda e, batch: jnp.asarray(batch, jnp.float32))
            >>> handle = (Sum() * 10).attach(engine, "tens")
            >>> engine.run([[1.0, 2.0]]).metrics
            {'tens': 30.0}
            >>> handle.remove(); engine.state.metrics
            {}
        """
        from ember.metrics._usage import resolve_usage

        resolved = resolve_usage(usage)
        self._attach_internal(engine, resolved, name)

        def completed(engine: Engine) -> None:
            engine.state.metrics[name] = self.compute()

        written = engine.add_priority_handler(resolved.compute, completed)

        def detach() -> None:
            written.remove()
            engine.state.metrics.pop(name, None)
            self._release_internal(engine)

        return AttachedMetric(detach)

    def _attach_internal(self, engine: Engine, usage: MetricUsage, key: str) -> None:
        for i, m in enumerate(self._dependencies()):
            m._attach_internal(engine, usage, f"{key}.{i}")

    def _release_internal(self, engine: Engine) -> None:
        for m in self._dependencies():
            m._release_internal(engine)

    def __repr__(self) -> str:
        return f"MetricsLambda({getattr(self.fn, '__name__', self.fn)!s}, {len(self.args)} args)"
