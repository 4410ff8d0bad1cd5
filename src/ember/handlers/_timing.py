"""`Timer` and `TimeLimit`: wall-clock time of parts of a run, and a budget for the whole of it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import jax

from ember.engine import Engine, Events, EventsList, FilteredEvent, RemovableEventHandle, collect_handles
from ember.handlers._resilience.agreement import any_process, check_interval, positive_or_none

log = logging.getLogger("ember")
Event = Events | FilteredEvent | EventsList


class Timer:
    """Ignite's timer: measures time between ``start``/``resume`` and ``pause`` events, optionally per step.

    JAX dispatch is asynchronous: a step "completes" on the host long before the device finishes it, so
    per-iteration times measure dispatch until the queue of in-flight steps fills, and the device's speed
    after that. Averaged over a run they are right; for exact per-step times pass ``sync=True``, which
    waits for the engine's output at each pause (and costs the overlap between host and device).

    Args:
        average: [`value`][ember.handlers.Timer.value] divides the total by the number of ``step`` events.
        sync: wait for ``engine.state.output`` to be computed before reading the clock at a pause.
        clock: seconds since some origin; injectable for tests.

    Examples:
        >>> from ember import Engine, Events
        >>> from ember.handlers import Timer
        >>> ticks = iter(range(100))
        >>> timer = Timer(average=True, clock=lambda: float(next(ticks)))
        >>> engine = Engine(lambda e, b: b)
        >>> _ = timer.attach(engine, start=Events.EPOCH_STARTED, resume=Events.ITERATION_STARTED,
        ...              pause=Events.ITERATION_COMPLETED, step=Events.ITERATION_COMPLETED)
        >>> _ = engine.run([1, 2, 3])
        >>> timer.value()  # each iteration took one tick
        1.0
    """

    def __init__(self, average: bool = False, *, sync: bool = False, clock: Callable[[], float] = time.perf_counter):
        self.average, self.sync, self._clock = bool(average), bool(sync), clock
        self._handle: RemovableEventHandle | None = None
        self.reset()

    def reset(self, *_: Any) -> Timer:
        """Start over: zero total, zero steps, running from now."""
        self._t0 = self._clock()
        self.total = 0.0
        self.step_count = 0
        self.running = True
        return self

    def pause(self, engine: Engine | None = None, *_: Any) -> None:
        """Stop counting (after the output is ready, with ``sync=True``)."""
        if self.running:
            if self.sync and engine is not None:
                jax.block_until_ready(engine.state.output)
            self.total += self._clock() - self._t0
            self.running = False

    def resume(self, *_: Any) -> None:
        """Count again from now."""
        if not self.running:
            self.running = True
            self._t0 = self._clock()

    def step(self, *_: Any) -> None:
        """Count one step, for ``average``."""
        self.step_count += 1

    def value(self) -> float:
        """Seconds counted (per step with ``average``)."""
        total = self.total + (self._clock() - self._t0 if self.running else 0.0)
        return total / max(self.step_count, 1) if self.average else total

    def attach(
        self,
        engine: Engine,
        start: Event = Events.STARTED,
        pause: Event = Events.COMPLETED,
        resume: Event | None = None,
        step: Event | None = None,
    ) -> Timer:
        """Reset at ``start``, pause at ``pause``, resume at ``resume``, count a step at ``step``; return the timer.

        Returns the timer itself, as Ignite's ``Timer.attach`` does, so ``Timer(average=True).attach(...)`` can be kept.

        Examples:
            >>> from ember import Engine, Events
            >>> from ember.handlers import Timer
            >>> engine = Engine(lambda e, b: b)
            >>> timer = Timer().attach(engine)  # the whole run
            >>> _ = engine.run([1]); timer.value() > 0
            True
        """
        with collect_handles() as made:
            engine.add_event_handler(start, self.reset)
            engine.add_event_handler(pause, self.pause)
            if resume is not None:
                engine.add_event_handler(resume, self.resume)
            if step is not None:
                engine.add_event_handler(step, self.step)
        self._handle = made.handle
        return self

    def detach(self) -> None:
        """Remove every handler [`attach`][ember.handlers.Timer.attach] registered.

        ``attach`` returns the timer itself, as Ignite's does (``timer = Timer().attach(trainer)``), so the timer
        undoes its own registrations.

        Examples:
            >>> from ember import Engine, Events
            >>> from ember.handlers import Timer
            >>> engine = Engine(lambda e, b: b)
            >>> timer = Timer().attach(engine, step=Events.ITERATION_COMPLETED)
            >>> timer.detach()
            >>> engine.has_event_handler(timer.step)
            False
        """
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


class TimeLimit:
    """Stops the engine at the first iteration that ends after ``limit_sec`` seconds of the run (Ignite's).

    The clock starts when the handler is made and again at the engine's STARTED when attached (added
    as a plain ITERATION_COMPLETED handler, as Ignite's examples do, it counts from its making). The
    engine finishes cleanly (COMPLETED fires, so checkpoints at COMPLETED are written), and the stop is not
    final: the saved state does not call the run complete, so a relaunch (the next session of a job with a
    time limit, Ignite's use for it) resumes from the checkpoint and trains on, as after `Preemption`. In a
    multi-process run the processes agree (a small collective each check): when one process's clock
    runs out, all stop at the same iteration. ``check_every`` spaces the checks out; by default a single
    process checks every iteration (a local test) and a multi-process run every 10 (a collective each).

    Args:
        limit_sec: the budget in seconds, positive (Ignite's default: 8 hours).
        check_every: check at the iterations that are multiples of it; ``None``: 1, or 10 with several
            processes.
        clock: seconds since some origin; injectable for tests.

    Examples:
        >>> from ember import Engine
        >>> from ember.handlers import TimeLimit
        >>> now = iter(range(100))
        >>> limit = TimeLimit(2.5, clock=lambda: float(next(now)))
        >>> engine = Engine(lambda e, b: b)
        >>> _ = limit.attach(engine)
        >>> engine.run(range(10)).iteration, limit.reached
        (3, True)
    """

    def __init__(
        self,
        limit_sec: float = 28800,
        *,
        check_every: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(limit_sec, bool) or not isinstance(limit_sec, int | float):
            raise TypeError(
                f"`limit_sec` must be a positive number of seconds, got {type(limit_sec).__name__} {limit_sec!r}."
            )
        if limit_sec <= 0:
            raise ValueError(f"`limit_sec` must be a positive number of seconds, got {limit_sec!r}.")
        self.check_every = positive_or_none("check_every", check_every)
        self.limit_sec, self._clock = float(limit_sec), clock
        self._start = clock()
        self._interval: int | None = None
        self.reached = False

    def _started(self) -> None:
        self._start, self.reached = self._clock(), False

    def __call__(self, engine: Engine) -> None:
        """Stop ``engine`` when the budget is spent (checked at multiples of ``check_every``)."""
        if self._interval is None:
            self._interval = check_interval(self.check_every)
        if engine.state.iteration % self._interval:
            return
        if not self.reached and any_process(self._clock() - self._start >= self.limit_sec):
            self.reached = True
            log.info("TimeLimit: %.1f s reached at iteration %d; stopping.", self.limit_sec, engine.state.iteration)
            engine.terminate(final=False)  # the next session trains on from the checkpoint

    def attach(self, engine: Engine) -> RemovableEventHandle:
        """Start the clock at STARTED; check at ITERATION_COMPLETED (every ``check_every`` iterations).

        Returns the handle of the check.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import TimeLimit
            >>> handle = TimeLimit(60).attach(Engine(lambda e, b: b))
        """
        with collect_handles() as made:
            engine.add_event_handler(Events.STARTED, self._started)
            engine.add_event_handler(Events.ITERATION_COMPLETED, self)
        return made.handle
