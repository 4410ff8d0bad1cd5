"""`StragglerReport`: which process of a multi-process run holds the others back, and by how much."""

from __future__ import annotations

import json
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

from ember._multiprocess import exchange
from ember.engine import Engine, Events, RemovableEventHandle, collect_handles
from ember.writers import Writer


class StragglerReport:
    """Every ``every`` iterations, and at each epoch's end, the processes' host times compared; a laggard named.

    In a multi-process run every step waits for the slowest process, so one slow data pipeline or busy host slows
    them all, and nothing says which. Each process measures, on its own host, its **step time** (from
    ITERATION_STARTED to the step function's return: dispatching the step, and waiting when the device queue is
    full or a collective waits for a peer) and its **time outside the step** (the rest of the window's wall time:
    fetching data, handlers), which is what a process spends while the others may wait for it. At each window's end
    the processes trade their numbers through JAX's coordination service (one small exchange, no device work). The
    median and the slowest of each go to ``writer`` as ``stragglers/step_time/median``, ``.../max``,
    ``stragglers/outside_step/median``, ``.../max`` (seconds per step) and ``stragglers/slowest`` (the process with
    the most time outside the step); a process whose time outside the step is ``factor`` times the median of the
    others', and more than a tenth of a step's wall time above it, for ``patience`` windows in a row is named once,
    in one line to ``say`` (a ``RuntimeWarning`` by default). Two handlers a step (the data wait on its own would
    take two more); in a single process it attaches nothing and costs nothing.

    Args:
        writer: where the numbers go, at the trainer's iteration (process 0's; ``None``: only `summary`).
        every: iterations in a window.
        factor: how many times the others' median own time makes a process lag.
        patience: windows in a row a process must lag to be named.
        say: what prints the line naming a laggard (``RuntimeWarning`` by default; ``ember train`` prints it).
        clock: the clock (injectable for tests).

    Examples:
        >>> from ember import Engine
        >>> from ember.handlers import StragglerReport
        >>> trainer = Engine(lambda e, b: b)
        >>> report = StragglerReport(every=2)
        >>> _ = report.attach(trainer)  # one process: nothing attached
        >>> _ = trainer.run(range(4))
        >>> report.summary()
        {'windows': 0, 'step_time': {}, 'outside_step': {}, 'named': []}
    """

    def __init__(
        self,
        writer: Writer | None = None,
        *,
        every: int = 100,
        factor: float = 2.0,
        patience: int = 3,
        say: Callable[[str], Any] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"`every` must be a positive number of iterations, got {every!r}.")
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 1 < factor < float("inf"):
            raise ValueError(f"`factor` must be a number above 1, got {factor!r}.")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"`patience` must be a positive number of windows, got {patience!r}.")
        self.writer, self.every, self.factor, self.patience = writer, every, float(factor), patience
        self.say = say or (lambda line: warnings.warn(line, RuntimeWarning, stacklevel=2))
        self.clock = clock
        self._lagging: dict[int, int] = {}  # windows in a row each process has lagged
        self._named: list[int] = []
        self._totals: dict[str, list[float]] = {}  # per process: steps, step time, time outside it
        self._windows = 0
        self._open()

    def _open(self) -> None:
        self._start = self._mark = self.clock()
        self._steps, self._step = 0, 0.0

    # -- the trainer's events: two handlers a step, the least a step's split costs --------------------

    def _stepping(self) -> None:
        self._mark = self.clock()

    def _stepped(self) -> None:
        self._step += self.clock() - self._mark
        self._steps += 1

    def _window(self, engine: Engine) -> None:
        if not self._steps:
            return  # an epoch's end right after a window's: nothing new
        mine = [self._steps, self._step, self.clock() - self._start]
        everyone = [json.loads(v) for v in exchange("stragglers", json.dumps(mine))]
        self._compare(engine.state.iteration, everyone)
        self._open()  # after the exchange: waiting for the others is no one's own time

    def _compare(self, iteration: int, everyone: list[list[float]]) -> None:
        steps = [step / n for n, step, _ in everyone]
        own = [(wall - step) / n for n, step, wall in everyone]
        slowest = max(range(len(own)), key=own.__getitem__)
        self._windows += 1
        for p, (n, step, wall) in enumerate(everyone):
            total = self._totals.setdefault(str(p), [0, 0.0, 0.0])
            total[0], total[1], total[2] = total[0] + n, total[1] + step, total[2] + wall - step
        wall = statistics.median(s + o for s, o in zip(steps, own, strict=True))
        for p, mine in enumerate(own):
            others = statistics.median(own[:p] + own[p + 1 :])
            lags = mine > self.factor * others and mine - others > 0.1 * wall
            self._lagging[p] = self._lagging.get(p, 0) + 1 if lags else 0
            if self._lagging[p] == self.patience and p not in self._named:
                self._named.append(p)
                self.say(
                    f"ember: process {p} lags: for {self.patience} windows of {self.every} iterations in a row (to "
                    f"iteration {iteration}) its time outside the step was {mine * 1e3:.1f} ms per step against "
                    f"{others * 1e3:.1f} ms for the others (its step {steps[p] * 1e3:.1f} ms)."
                )
        if self.writer is not None:
            self.writer.write_scalars(
                iteration,
                {
                    "stragglers/step_time/median": statistics.median(steps),
                    "stragglers/step_time/max": max(steps),
                    "stragglers/outside_step/median": statistics.median(own),
                    "stragglers/outside_step/max": max(own),
                    "stragglers/slowest": slowest,
                },
            )

    def summary(self) -> dict[str, Any]:
        """The spread over every window so far: each process's step time and time outside it per step, who lagged.

        ``step_time`` and ``outside_step`` map each process (as text, as JSON keeps it) to its seconds per step;
        ``named`` lists the processes named as lagging. The goodput ledger keeps it in its record.

        Examples:
            >>> from ember.handlers import StragglerReport
            >>> StragglerReport().summary()["windows"]
            0
        """
        per = {p: t for p, t in self._totals.items() if t[0]}
        return {
            "windows": self._windows,
            "step_time": {p: t[1] / t[0] for p, t in per.items()},
            "outside_step": {p: t[2] / t[0] for p, t in per.items()},
            "named": list(self._named),
        }

    def attach(self, trainer: Engine) -> RemovableEventHandle:
        """Measure ``trainer``'s iterations and compare the processes every ``every`` and at each epoch's end.

        Nothing is attached in a single process (the handle removes nothing).

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import StragglerReport
            >>> handle = StragglerReport().attach(Engine(lambda e, b: b))
        """
        import jax

        with collect_handles() as made:
            if jax.process_count() > 1:
                trainer.add_event_handler(Events.STARTED, self._open)
                trainer.add_event_handler(Events.ITERATION_STARTED, self._stepping)
                trainer.add_priority_handler(Events.ITERATION_COMPLETED, self._stepped)
                trainer.add_event_handler(Events.ITERATION_COMPLETED(every=self.every), self._window)
                trainer.add_event_handler(Events.EPOCH_COMPLETED, self._window)
        return made.handle
