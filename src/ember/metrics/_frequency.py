"""`Frequency`: Ignite's examples (or tokens) per second, a metric written Ignite's way."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ember.engine import Engine, Events
from ember.metrics._composite import AttachedMetric
from ember.metrics._ignite_style import reinit__is_reduced, sync_all_reduce
from ember.metrics._metric import Metric
from ember.metrics._usage import Event, MetricUsage


class Frequency(Metric):
    """The number of items processed per second since the epoch started (Ignite's ``Frequency``).

    Each iteration adds what ``output_transform`` returns (the batch's examples or tokens); the value is that sum over
    the seconds since the epoch's start, as an ``int``, written at ``event_name`` (every iteration by default). With
    several processes the counts are summed over them.

    Examples:
        >>> from ember import Engine, Events
        >>> from ember.metrics import Frequency
        >>> engine = Engine(lambda e, batch: {"ntokens": 128})
        >>> _ = Frequency(output_transform=lambda out: out["ntokens"]).attach(engine, "tps")
        >>> engine.run(range(4)).metrics["tps"] > 0
        True
    """

    def __init__(
        self,
        output_transform: Callable[[Any], Any] | None = None,
        device: Any = None,
        skip_unrolling: bool = False,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._clock = clock
        super().__init__(output_transform, device, skip_unrolling)

    @reinit__is_reduced
    def reset(self) -> None:
        """Start counting from now."""
        self._started, self._n, self._elapsed = self._clock(), 0, 0.0
        super().reset()

    @reinit__is_reduced
    def update(self, output: Any) -> None:
        """Add this iteration's count."""
        self._n += int(output)
        self._elapsed = self._clock() - self._started

    @sync_all_reduce("_n")
    def compute(self) -> int:
        """Items per second since the start (0 before a second's fraction has passed)."""
        return int(self._n / self._elapsed) if self._elapsed > 0 else 0

    def attach(  # type: ignore[override]  # Ignite's signature
        self, engine: Engine, name: str, event_name: Event = Events.ITERATION_COMPLETED
    ) -> AttachedMetric:
        """Count from each epoch's start, every iteration; write the value at ``event_name`` (Ignite's)."""
        usage = MetricUsage("frequency", Events.EPOCH_STARTED, Events.ITERATION_COMPLETED, event_name)
        return super().attach(engine, name, usage)
