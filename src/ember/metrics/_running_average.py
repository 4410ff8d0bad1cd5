"""`RunningAverage`: an exponential moving average of a metric's batch value or of an output, on device."""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ember.engine import Engine, Events
from ember.metrics._composite import AttachedMetric
from ember.metrics._metric import Metric
from ember.metrics._usage import EPOCH_WISE, RUNNING_BATCH_WISE, SINGLE_EPOCH_RUNNING_BATCH_WISE, resolve_usage


class RunningAverage(Metric):
    """``avg = alpha * avg + (1 - alpha) * value`` each iteration, starting from the first value, as Ignite.

    ``value`` is ``src``'s value on the current batch (its accumulators for that batch alone, finalised on device), or
    ``output_transform(output)``. The average stays on device: attached (by default every iteration, over the whole
    run), ``engine.state.metrics[name]`` holds a device scalar, so nothing is read back until a handler converts it;
    [`compute`][ember.metrics.Metric.compute] returns a float. In a multi-process run the published value is this
    process's (no collective per step) and [`compute`][ember.metrics.Metric.compute] is the mean over processes.

    Attached with [`RunningEpochWise`][ember.metrics.RunningEpochWise] (Ignite's), the average is taken over epochs
    instead: ``src`` accumulates over each epoch and its epoch value joins the average at EPOCH_COMPLETED (an output's
    value is the epoch's last).

    Args:
        src: a metric whose per-batch value is averaged; or ``None`` to average an output.
        alpha: the weight of the past, in ``(0, 1)``.
        output_transform: with ``src=None``, picks the value from the output (e.g. ``lambda o: o["loss"]``).
        epoch_bound: deprecated (Ignite's, which warns): ``True`` attaches with
            [`SingleEpochRunningBatchWise`][ember.metrics.SingleEpochRunningBatchWise] (the average restarts each
            epoch), ``False`` with [`RunningBatchWise`][ember.metrics.RunningBatchWise], whatever usage ``attach`` is
            given; pass the usage to ``attach`` instead.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import RunningAverage
        >>> avg = RunningAverage(output_transform=lambda out: out, alpha=0.98)
        >>> for x in [0.0, 1.0, 0.0, 1.0]:
        ...     avg.update(jnp.array(x))
        >>> round(avg.compute(), 6)
        0.039208
    """

    keys = ()

    publishes_values = True  # the running value, every step

    def __init__(
        self,
        src: Metric | None = None,
        *,
        alpha: float = 0.98,
        output_transform: Callable[[Any], Any] | None = None,
        epoch_bound: bool | None = None,
        device: Any = None,
    ) -> None:
        if (src is None) == (output_transform is None):
            raise ValueError("RunningAverage takes exactly one of `src` (a metric) and `output_transform`.")
        if src is not None and not isinstance(src, Metric):
            raise TypeError(f"`src` must be a Metric, got {type(src).__name__}.")
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1:
            raise ValueError(f"`alpha` must be a number in (0, 1), got {alpha!r}.")
        if epoch_bound is not None:
            warnings.warn(
                "`epoch_bound` is deprecated and will be removed in the future. Consider using `usage` argument of "
                "`attach` method instead. `epoch_bound=True` is equivalent with `usage=SingleEpochRunningBatchWise()` "
                "and `epoch_bound=False` is equivalent with `usage=RunningBatchWise()`.",
                UserWarning,
                stacklevel=2,
            )
        self.src = src
        self.alpha = float(alpha)
        self.epoch_bound = epoch_bound
        self._over_epochs: weakref.WeakSet[Engine] = weakref.WeakSet()  # engines where src joins once per epoch
        super().__init__(output_transform, device, mask_key=None)

    def arguments(self, output: Any) -> tuple[tuple[Any, ...], Any]:
        if self.src is not None:
            return self.src.arguments(output)
        # the ignore below: output_transform is set whenever this branch runs
        return (self._output_transform(output),), None  # type: ignore[misc]

    def empty(self) -> Any:
        # (average, started); "started" is a float32 0/1: a bool leaf costs a compiled step ~40 us on XLA:CPU.
        return (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))

    def batch_state(self, *args: Any, mask: Any = None) -> Any:
        value = args[0] if self.src is None else self.src.finalize(self.src.batch_state(*args, mask=mask))
        return jnp.asarray(value, jnp.float32)

    def _merge_batch(self, state: Any, args: tuple[Any, ...], mask: Any) -> Any:
        return self._fold(state, self.batch_state(*args, mask=mask))

    def _fold(self, state: Any, value: Any) -> Any:
        avg, started = state
        return (jnp.where(started > 0, self.alpha * avg + (1 - self.alpha) * value, value), jnp.ones((), jnp.float32))

    def finalize(self, state: Any) -> Any:
        return state[0]

    def published_value(self, state: Any) -> Any:
        """The running average, published in ``state.metrics`` every step."""
        return self.finalize(state)

    def merge_processes(self, parts: list[Any]) -> Any:
        """Across processes, the mean of their running averages."""
        started = [p for p in parts if float(p[1]) > 0]
        if not started:
            return parts[0]
        return (sum(p[0] for p in started) / len(started), started[0][1])

    def attach(self, engine: Engine, name: str, usage: Any = RUNNING_BATCH_WISE) -> AttachedMetric:
        """Attach; by default reset at STARTED and publish the device value every iteration.

        With [`RunningEpochWise`][ember.metrics.RunningEpochWise] and a ``src`` metric, ``src`` is attached to
        accumulate each epoch (as [`EpochWise`][ember.metrics.EpochWise]) and its epoch value joins the average at
        EPOCH_COMPLETED.

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember import Engine
            >>> from ember.metrics import RunningAverage
            >>> engine = Engine(lambda e, batch: {"loss": jnp.array(batch)})
            >>> _ = RunningAverage(output_transform=lambda out: out["loss"]).attach(engine, "loss")
            >>> round(float(engine.run([0.0, 1.0]).metrics["loss"]), 4)
            0.02
        """
        if self.epoch_bound is not None:
            usage = SINGLE_EPOCH_RUNNING_BATCH_WISE if self.epoch_bound else RUNNING_BATCH_WISE
        usage = resolve_usage(usage)
        if self.src is not None and usage.update is Events.EPOCH_COMPLETED and engine not in self._over_epochs:
            self.src._attach_internal(engine, EPOCH_WISE, f"{name}:src")
            self._over_epochs.add(engine)
        return super().attach(engine, name, usage)

    def _update_on(self, engine: Engine) -> None:
        if self.src is None or engine not in self._over_epochs:
            super()._update_on(engine)
            return
        if not self.src._updates:
            return  # an epoch without a batch adds nothing
        self.set_state(self._fold_fn(self._state, self.src.finalize(self.src.global_state())))

    @functools.cached_property
    def _fold_fn(self) -> Callable[[Any, Any], Any]:
        return jax.jit(lambda state, value: self._fold(state, jnp.asarray(value, jnp.float32)))

    def detach(self, engine: Engine, name: str | None = None) -> None:
        """As [`Metric.detach`][ember.metrics.Metric.detach]; a ``src`` attached for epochs is released with it.

        Examples:
            >>> from ember import Engine
            >>> from ember.metrics import Accuracy, RunningAverage, RunningEpochWise
            >>> engine, avg = Engine(lambda e, b: b), RunningAverage(Accuracy())
            >>> _ = avg.attach(engine, "acc", usage=RunningEpochWise()); avg.detach(engine)
            >>> avg.src.is_attached(engine)
            False
        """
        super().detach(engine, name)
        if self.src is not None and engine in self._over_epochs and not self.is_attached(engine):
            self._over_epochs.discard(engine)
            self.src._release_internal(engine)

    def _value_on(self, engine: Engine) -> Any:
        # The value the compiled step published, or (updated by a handler) finalised here: a device
        # scalar either way, no host read.
        return self._published if self._published is not None else self.finalize(self._state)
