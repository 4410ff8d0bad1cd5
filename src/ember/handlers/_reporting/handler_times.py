"""`HandlersTimeProfiler`: the time each handler takes on each event, and the data and step times (Ignite's)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from ember.engine import Engine, Events, RemovableEventHandle, collect_handles


def handler_name(handler: Callable[..., Any]) -> str:
    """How a profiler names a handler: ``Class.method`` for a bound method, else its qualified name."""
    owner = getattr(handler, "__self__", None)
    if owner is not None:
        return f"{type(owner).__name__}.{getattr(handler, '__name__', '?')}"
    return getattr(handler, "__qualname__", None) or type(handler).__name__


class Clocked(Protocol):
    """A profiler's handlers, which `attach_clocks` registers: wrap at the start, the marks, unwrap at the end."""

    def _started(self, engine: Engine) -> None: ...
    def _mark_now(self) -> None: ...
    def _data_done(self, engine: Engine) -> None: ...
    def _step_done(self, engine: Engine) -> None: ...
    def _finished(self) -> None: ...


def attach_clocks(engine: Engine, profiler: Clocked) -> RemovableEventHandle:
    """Register a profiler's clocks; return one handle for them all.

    Its start first of STARTED, a mark at GET_BATCH_STARTED and ITERATION_STARTED read first at GET_BATCH_COMPLETED
    (the data) and ITERATION_COMPLETED (the step), its end at COMPLETED.
    """
    with collect_handles() as made:
        engine.add_priority_handler(Events.STARTED, profiler._started)
        engine.add_event_handler(Events.GET_BATCH_STARTED, profiler._mark_now)
        engine.add_priority_handler(Events.GET_BATCH_COMPLETED, profiler._data_done)
        engine.add_event_handler(Events.ITERATION_STARTED, profiler._mark_now)
        engine.add_priority_handler(Events.ITERATION_COMPLETED, profiler._step_done)
        engine.add_event_handler(Events.COMPLETED, profiler._finished)
    return made.handle


class _Times:
    """Count, total and largest of a series of durations."""

    __slots__ = ("count", "max", "total")

    def __init__(self) -> None:
        self.count, self.total, self.max = 0, 0.0, 0.0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.max = max(self.max, seconds)

    def as_dict(self) -> dict[str, float]:
        mean = self.total / self.count if self.count else 0.0
        return {"count": self.count, "total": self.total, "mean": mean, "max": self.max}


class HandlersTimeProfiler:
    """Times every handler on every event, the data loading and the step, over a run (Ignite's profiler).

    At the run's start every handler registered on the engine is wrapped with a clock read before and after
    (handlers added later are not timed); at its end they are unwrapped and, with ``stream``, a table is
    printed. Nothing is timed, and nothing costs anything, when no profiler is attached. ``data`` is the
    time between GET_BATCH_STARTED and GET_BATCH_COMPLETED (the data's ``next``); ``step`` the time
    between ITERATION_STARTED's handlers and ITERATION_COMPLETED's, which for a compiled trainer is the
    step's dispatch, not the device's work (asynchronous; see ``Throughput`` for that).

    Args:
        stream: where the table goes at COMPLETED; ``None`` to print nothing (`results` holds it all).
        clock: seconds since some origin; injectable for tests.

    Examples:
        >>> import io
        >>> from ember import Engine, Events
        >>> from ember.handlers import HandlersTimeProfiler
        >>> engine = Engine(lambda e, b: b)
        >>> _ = engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: None)
        >>> profiler = HandlersTimeProfiler(stream=None)
        >>> _ = profiler.attach(engine)
        >>> _ = engine.run(range(3))
        >>> profiler.results["handlers"]["ITERATION_COMPLETED"]["<lambda>"]["count"], profiler.results["data"]["count"]
        (3, 3)
    """

    def __init__(self, *, stream: TextIO | None = sys.stdout, clock: Callable[[], float] = time.perf_counter) -> None:
        if not callable(clock):
            raise TypeError(f"`clock` must be callable as clock() -> seconds, got {clock!r}.")
        self.stream, self.clock = stream, clock
        self._handlers: dict[tuple[str, str], _Times] = {}
        self._data, self._step = _Times(), _Times()
        self._mark = 0.0
        self._undo: Callable[[], None] | None = None

    def _wrap(self, event: Any, handler: Callable[..., Any], call: Callable[..., Any]) -> Callable[..., Any]:
        times = self._handlers.setdefault((getattr(event, "name", str(event)), handler_name(handler)), _Times())
        clock = self.clock

        def timed(engine: Any, *args: Any) -> Any:
            start = clock()
            try:
                return call(engine, *args)
            finally:
                times.add(clock() - start)

        return timed

    def _started(self, engine: Engine) -> None:
        if self._undo is not None:  # the last run ended in an exception: its wrappers are still there
            self._undo()
        self._handlers.clear()
        self._data, self._step = _Times(), _Times()
        own = {self._started, self._mark_now, self._data_done, self._step_done, self._finished}
        self._undo = engine.wrap_handlers(lambda e, h, call: call if h in own else self._wrap(e, h, call))

    def _mark_now(self) -> None:
        self._mark = self.clock()

    def _data_done(self, engine: Engine) -> None:
        self._data.add(self.clock() - self._mark)

    def _step_done(self, engine: Engine) -> None:
        self._step.add(self.clock() - self._mark)

    def _finished(self) -> None:
        if self._undo is not None:
            self._undo()
            self._undo = None
        if self.stream is not None:
            self.print_results()

    @property
    def results(self) -> dict[str, Any]:
        """``{"handlers": {event: {handler: stats}}, "data": stats, "step": stats}``; stats in seconds."""
        handlers: dict[str, dict[str, dict[str, float]]] = {}
        for (event, name), times in self._handlers.items():
            if times.count:
                handlers.setdefault(event, {})[name] = times.as_dict()
        return {"handlers": handlers, "data": self._data.as_dict(), "step": self._step.as_dict()}

    def print_results(self, stream: TextIO | None = None) -> None:
        """Print the table: one row per handler that ran, then the data and the step, slowest total first."""
        out = stream or self.stream or sys.stdout
        results = self.results
        rows = [(f"{event}: {name}", t) for event, names in results["handlers"].items() for name, t in names.items()]
        rows.sort(key=lambda row: -row[1]["total"])
        rows += [("data (next batch)", results["data"]), ("step (dispatch)", results["step"])]
        width = max(len(label) for label, _ in rows)
        print(f"{'handler':<{width}}  {'calls':>7}  {'total s':>9}  {'mean ms':>9}  {'max ms':>9}", file=out)
        for label, t in rows:
            line = f"{label:<{width}}  {t['count']:>7}  {t['total']:>9.4f}  {t['mean'] * 1e3:>9.3f}"
            print(f"{line}  {t['max'] * 1e3:>9.3f}", file=out)

    def attach(self, engine: Engine) -> RemovableEventHandle:
        """Wrap the engine's handlers at STARTED, unwrap and report at COMPLETED; return the STARTED handle.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import HandlersTimeProfiler
            >>> handle = HandlersTimeProfiler(stream=None).attach(Engine(lambda e, b: b))
        """
        return attach_clocks(engine, self)
