"""Metric usages: when a metric resets, updates and computes on an engine, with Ignite's usage classes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ember.engine import Events, FilteredEvent

Event = Events | FilteredEvent


@dataclass(frozen=True)
class MetricUsage:
    """When an attached metric resets, updates and writes ``engine.state.metrics[name]``.

    Ignite's usages are its subclasses, by Ignite's names: [`EpochWise`][ember.metrics.EpochWise],
    [`BatchWise`][ember.metrics.BatchWise], [`RunningEpochWise`][ember.metrics.RunningEpochWise],
    [`RunningBatchWise`][ember.metrics.RunningBatchWise],
    [`SingleEpochRunningBatchWise`][ember.metrics.SingleEpochRunningBatchWise] and
    [`BatchFiltered`][ember.metrics.BatchFiltered]; ``attach`` takes one of them, its ``usage_name``, or any
    ``MetricUsage(name, reset, update, compute)``.

    Attributes:
        name: how the usage is called in ``attach(engine, name, usage=...)``.
        reset: the event that resets the accumulators (Ignite's ``STARTED``).
        update: the event whose output updates them (Ignite's ``ITERATION_COMPLETED``).
        compute: the event that computes the value, the only host read (Ignite's ``COMPLETED``).

    Examples:
        >>> from ember.metrics import MetricUsage
        >>> from ember import Events
        >>> cumulative = MetricUsage("cumulative", Events.STARTED, Events.ITERATION_COMPLETED, Events.EPOCH_COMPLETED)
        >>> cumulative.STARTED, cumulative.COMPLETED
        (Events.STARTED, Events.EPOCH_COMPLETED)
    """

    name: str
    reset: Event
    update: Event
    compute: Event

    @property
    def STARTED(self) -> Event:
        """Ignite's name of `reset`."""
        return self.reset

    @property
    def COMPLETED(self) -> Event:
        """Ignite's name of `compute`."""
        return self.compute

    @property
    def ITERATION_COMPLETED(self) -> Event:
        """Ignite's name of `update`."""
        return self.update

    @staticmethod
    def filtered(update: Event) -> MetricUsage:
        """Epoch-wise, updated at the iterations ``update`` selects: [`BatchFiltered`][ember.metrics.BatchFiltered].

        Examples:
            >>> from ember.metrics import MetricUsage
            >>> from ember import Events
            >>> MetricUsage.filtered(Events.ITERATION_COMPLETED(once=[1, 3])).name
            'filtered'
        """
        if not isinstance(update, FilteredEvent) or update.event is not Events.ITERATION_COMPLETED:
            raise ValueError(f"A filtered usage takes Events.ITERATION_COMPLETED(...) with a filter, got {update!r}.")
        return _batch_filtered(update)


class _IgniteUsage(MetricUsage):
    """An Ignite usage class: its ``usage_name`` and its ``(reset, update, compute)`` events, as class attributes."""

    usage_name: ClassVar[str]
    events: ClassVar[tuple[Event, Event, Event]]

    def __init__(self) -> None:
        MetricUsage.__init__(self, self.usage_name, *self.events)


class EpochWise(_IgniteUsage):
    """Ignite's default usage: reset at EPOCH_STARTED, update every iteration, compute at EPOCH_COMPLETED.

    Examples:
        >>> from ember.metrics import EpochWise
        >>> EpochWise().usage_name, EpochWise().COMPLETED
        ('epoch_wise', Events.EPOCH_COMPLETED)
    """

    usage_name: ClassVar[str] = "epoch_wise"
    events = (Events.EPOCH_STARTED, Events.ITERATION_COMPLETED, Events.EPOCH_COMPLETED)


class BatchWise(_IgniteUsage):
    """Each batch's value: reset at ITERATION_STARTED, update and compute at ITERATION_COMPLETED.

    Examples:
        >>> from ember.metrics import BatchWise
        >>> BatchWise().STARTED
        Events.ITERATION_STARTED
    """

    usage_name: ClassVar[str] = "batch_wise"
    events = (Events.ITERATION_STARTED, Events.ITERATION_COMPLETED, Events.ITERATION_COMPLETED)


class RunningEpochWise(EpochWise):
    """Reset once at STARTED; update and compute at each EPOCH_COMPLETED (Ignite's).

    Meant for [`RunningAverage`][ember.metrics.RunningAverage] of a metric: the metric's epoch value joins the
    average at each epoch's end. Another metric reads the epoch's last output there.

    Examples:
        >>> from ember.metrics import RunningEpochWise
        >>> RunningEpochWise().ITERATION_COMPLETED
        Events.EPOCH_COMPLETED
    """

    usage_name: ClassVar[str] = "running_epoch_wise"
    events = (Events.STARTED, Events.EPOCH_COMPLETED, Events.EPOCH_COMPLETED)


class RunningBatchWise(BatchWise):
    """Reset once at STARTED; update and compute every iteration: the run so far (a host read each iteration).

    Examples:
        >>> from ember.metrics import RunningBatchWise
        >>> RunningBatchWise().usage_name
        'running_batch_wise'
    """

    usage_name: ClassVar[str] = "running_batch_wise"
    events = (Events.STARTED, Events.ITERATION_COMPLETED, Events.ITERATION_COMPLETED)


class SingleEpochRunningBatchWise(BatchWise):
    """Reset at EPOCH_STARTED; update and compute every iteration: the epoch so far (a host read each iteration).

    Examples:
        >>> from ember.metrics import SingleEpochRunningBatchWise
        >>> SingleEpochRunningBatchWise().STARTED
        Events.EPOCH_STARTED
    """

    usage_name: ClassVar[str] = "single_epoch_running_batch_wise"
    events = (Events.EPOCH_STARTED, Events.ITERATION_COMPLETED, Events.ITERATION_COMPLETED)


class BatchFiltered(MetricUsage):
    """Epoch-wise, updated only at the iterations ``Events.ITERATION_COMPLETED(*args, **kwargs)`` selects.

    Examples:
        >>> from ember.metrics import BatchFiltered
        >>> BatchFiltered(every=2).ITERATION_COMPLETED
        Events.ITERATION_COMPLETED(every=2)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        update = Events.ITERATION_COMPLETED(*args, **kwargs)
        super().__init__("filtered", Events.EPOCH_STARTED, update, Events.EPOCH_COMPLETED)


def _batch_filtered(update: FilteredEvent) -> BatchFiltered:
    usage = BatchFiltered.__new__(BatchFiltered)
    MetricUsage.__init__(usage, "filtered", Events.EPOCH_STARTED, update, Events.EPOCH_COMPLETED)
    return usage


#: reset at EPOCH_STARTED, update every iteration, compute at EPOCH_COMPLETED (the default).
EPOCH_WISE = EpochWise()
#: reset at ITERATION_STARTED, update and compute at ITERATION_COMPLETED: the value of each batch.
BATCH_WISE = BatchWise()
#: reset once at STARTED, update and compute at EPOCH_COMPLETED (Ignite's; for a running average of a metric).
RUNNING_EPOCH_WISE = RunningEpochWise()
#: reset once at STARTED, update and compute every iteration: the whole run so far, at every iteration.
RUNNING_BATCH_WISE = RunningBatchWise()
#: reset at EPOCH_STARTED, update and compute every iteration: the epoch so far (a host read per iteration).
SINGLE_EPOCH_RUNNING_BATCH_WISE = SingleEpochRunningBatchWise()

USAGES = {
    u.name: u for u in (EPOCH_WISE, BATCH_WISE, RUNNING_EPOCH_WISE, RUNNING_BATCH_WISE, SINGLE_EPOCH_RUNNING_BATCH_WISE)
}


def resolve_usage(usage: str | MetricUsage) -> MetricUsage:
    """A usage from its name or itself; raise naming the choices."""
    if isinstance(usage, MetricUsage):
        return usage
    if isinstance(usage, str) and usage in USAGES:
        return USAGES[usage]
    raise ValueError(
        f"`usage` must be one of {sorted(USAGES)}, a MetricUsage (EpochWise(), RunningBatchWise(), ...) or "
        f"MetricUsage.filtered(Events.ITERATION_COMPLETED(...)), got {usage!r}."
    )
