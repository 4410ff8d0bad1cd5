"""Metric usages: when a metric resets, updates and computes on an engine."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from ember.engine import Events, FilteredEvent

Event = Events | FilteredEvent


@dataclass(frozen=True)
class MetricUsage:
    """When an attached metric resets, updates and writes ``engine.state.metrics[name]``.

    Attributes:
        name: how the usage is called in ``attach(engine, name, usage=...)``.
        reset: the event that resets the accumulators.
        update: the event whose output updates them.
        compute: the event that computes the value (the only host read).

    Examples:
        >>> from ember.metrics import MetricUsage
        >>> from ember import Events
        >>> MetricUsage.filtered(Events.ITERATION_COMPLETED(every=2)).update
        Events.ITERATION_COMPLETED(every=2)
    """

    name: str
    reset: Event
    update: Event
    compute: Event

    @staticmethod
    def filtered(update: Event) -> MetricUsage:
        """Epoch-wise, but updated only at the iterations ``update`` selects.

        Examples:
            >>> from ember.metrics import MetricUsage
            >>> from ember import Events
            >>> MetricUsage.filtered(Events.ITERATION_COMPLETED(once=[1, 3])).name
            'filtered'
        """
        if not isinstance(update, FilteredEvent) or update.event is not Events.ITERATION_COMPLETED:
            raise ValueError(f"A filtered usage takes Events.ITERATION_COMPLETED(...) with a filter, got {update!r}.")
        return MetricUsage("filtered", Events.EPOCH_STARTED, update, Events.EPOCH_COMPLETED)


#: reset at EPOCH_STARTED, update every iteration, compute at EPOCH_COMPLETED (the default).
EPOCH_WISE = MetricUsage("epoch_wise", Events.EPOCH_STARTED, Events.ITERATION_COMPLETED, Events.EPOCH_COMPLETED)
#: reset at ITERATION_STARTED, update and compute at ITERATION_COMPLETED: the value of each batch.
BATCH_WISE = MetricUsage("batch_wise", Events.ITERATION_STARTED, Events.ITERATION_COMPLETED, Events.ITERATION_COMPLETED)
#: reset once at STARTED, update every iteration, compute at EPOCH_COMPLETED: over the whole run so far.
RUNNING_EPOCH_WISE = MetricUsage(
    "running_epoch_wise", Events.STARTED, Events.ITERATION_COMPLETED, Events.EPOCH_COMPLETED
)
#: reset once at STARTED, update and compute every iteration: the whole run so far, at every iteration.
RUNNING_BATCH_WISE = MetricUsage(
    "running_batch_wise", Events.STARTED, Events.ITERATION_COMPLETED, Events.ITERATION_COMPLETED
)
#: reset at EPOCH_STARTED, update and compute every iteration: the epoch so far (a host read per iteration).
SINGLE_EPOCH_RUNNING_BATCH_WISE = MetricUsage(
    "single_epoch_running_batch_wise", Events.EPOCH_STARTED, Events.ITERATION_COMPLETED, Events.ITERATION_COMPLETED
)

USAGES = {
    u.name: u for u in (EPOCH_WISE, BATCH_WISE, RUNNING_EPOCH_WISE, RUNNING_BATCH_WISE, SINGLE_EPOCH_RUNNING_BATCH_WISE)
}
#: ember's names before Ignite's (one release of warnings, then gone): old name -> Ignite's.
RENAMED = {"running": "running_epoch_wise", "single_epoch_running": "single_epoch_running_batch_wise"}


def resolve_usage(usage: str | MetricUsage) -> MetricUsage:
    """A usage from its name or itself; raise naming the choices."""
    if isinstance(usage, MetricUsage):
        return usage
    if isinstance(usage, str) and usage in RENAMED:
        warnings.warn(
            f"usage={usage!r} is deprecated and goes in the next release: use {RENAMED[usage]!r} (Ignite's name).",
            DeprecationWarning,
            stacklevel=3,
        )
        usage = RENAMED[usage]
    if isinstance(usage, str) and usage in USAGES:
        return USAGES[usage]
    raise ValueError(
        f"`usage` must be one of {sorted(USAGES)} or MetricUsage.filtered(Events.ITERATION_COMPLETED(...)), "
        f"got {usage!r}."
    )
