"""`LRMonitor`: the learning rate, every N iterations, without a device round trip."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from ember.engine import Engine, Events, EventsList, FilteredEvent, RemovableEventHandle, collect_handles
from ember.handlers._reporting.loggers import as_async
from ember.writers import Writer


class LRMonitor:
    """Writes the learning rate the last step used, under ``tag``, at the trainer's iteration.

    With ``schedule`` (the optax schedule the optimizer uses) the rate is ``schedule(iteration - 1)`` evaluated on the
    host's CPU device, no accelerator involved, and handed to the writer unread. Without ``schedule`` the rate is the
    step's own ``output["lr"]`` (``create_trainer(..., extras=("lr",))`` computes it in the step, from an
    ``optax.inject_hyperparams`` state or the schedule), a device scalar converted on the writer's thread: the way
    for a CPU backend, where the schedule's eager operations would wait for the steps queued on the same device
    (``ember train`` takes it). `last` is the last value written, as a host float (reading it waits for that value).

    Args:
        writer: where the rate goes (wrapped in an ``AsyncWriter``).
        schedule: ``schedule(step) -> rate``; else the train state's injected hyperparameter.
        tag: the scalar's name.
        steps_per_update: iterations per optimizer update (``accumulate_steps`` of the trainer).

    Examples:
        >>> import io, optax
        >>> from ember import Engine, Events
        >>> from ember.handlers import LRMonitor
        >>> from ember.writers import ConsoleWriter
        >>> out, engine = io.StringIO(), Engine(lambda e, b: b)
        >>> schedule = optax.linear_schedule(1.0, 0.0, transition_steps=4)
        >>> _ = LRMonitor(ConsoleWriter(out), schedule=schedule).attach(engine, Events.ITERATION_COMPLETED(every=2))
        >>> _ = engine.run(range(4))
        >>> [line.split(" | ")[-1] for line in out.getvalue().splitlines()]
        ['lr 0.7500', 'lr 0.2500']
    """

    def __init__(
        self,
        writer: Writer,
        *,
        schedule: Callable[[Any], Any] | None = None,
        tag: str = "lr",
        steps_per_update: int = 1,
    ) -> None:
        if schedule is not None and not callable(schedule):
            raise TypeError(f"`schedule` must be callable as schedule(step), got {schedule!r}.")
        if isinstance(steps_per_update, bool) or not isinstance(steps_per_update, int) or steps_per_update < 1:
            raise ValueError(f"`steps_per_update` must be a positive int, got {steps_per_update!r}.")
        self.writer, self.schedule, self.tag, self.steps_per_update = writer, schedule, tag, steps_per_update
        self._last: Any = None

    @property
    def last(self) -> float | None:
        """The last rate written, as a host float (``None`` before the first)."""
        return None if self._last is None else float(np.asarray(self._last))

    def rate(self, engine: Engine) -> Any:
        """The learning rate of ``engine``'s last step: a host float, or a scalar on a device, not awaited."""
        if self.schedule is not None:
            step = (engine.state.iteration - 1) // self.steps_per_update
            with jax.default_device(jax.local_devices(backend="cpu")[0]):  # the host's CPU, never an accelerator
                return self.schedule(step)  # dispatched, not awaited (JAX's eager ops are compiled once per process)
        output = engine.state.output
        if not isinstance(output, Mapping) or "lr" not in output:
            raise ValueError(
                "LRMonitor without `schedule` reads output['lr']: build the trainer with "
                "create_trainer(..., extras=('lr',)), or pass schedule= (the schedule the optimizer uses)."
            )
        return output["lr"]

    def __call__(self, engine: Engine) -> None:
        """Write the rate at the engine's iteration."""
        self._last = self.rate(engine)
        self.writer.write_scalars(engine.state.iteration, {self.tag: self._last})

    def attach(self, engine: Engine, event: Events | FilteredEvent | EventsList | None = None) -> RemovableEventHandle:
        """Write on ``event`` (every 100 iterations by default).

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import LRMonitor
            >>> from ember.writers import ConsoleWriter
            >>> handle = LRMonitor(ConsoleWriter(), schedule=lambda step: 0.1).attach(Engine(lambda e, b: b))
        """
        with collect_handles() as made:
            engine.add_event_handler(event or Events.ITERATION_COMPLETED(every=100), self)
            self.writer = as_async(self.writer, engine)
        return made.handle
