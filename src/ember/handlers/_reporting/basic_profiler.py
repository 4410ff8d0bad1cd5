"""`BasicTimeProfiler`: Ignite's per-event profile of a run: the step, the data, and each event's handlers."""

from __future__ import annotations

import csv
import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ember.engine import Engine, Events, RemovableEventHandle
from ember.handlers._reporting.handler_times import attach_clocks, handler_name

#: The events profiled, in Ignite's order (its ``Events`` less the ones it ignores).
EVENTS = (
    Events.EPOCH_STARTED,
    Events.EPOCH_COMPLETED,
    Events.STARTED,
    Events.COMPLETED,
    Events.ITERATION_STARTED,
    Events.ITERATION_COMPLETED,
    Events.GET_BATCH_STARTED,
    Events.GET_BATCH_COMPLETED,
)
_PER_RUN, _PER_EPOCH = (Events.STARTED, Events.COMPLETED), (Events.EPOCH_STARTED, Events.EPOCH_COMPLETED)
_PER_ITERATION = (
    Events.ITERATION_STARTED,
    Events.ITERATION_COMPLETED,
    Events.GET_BATCH_STARTED,
    Events.GET_BATCH_COMPLETED,
)


class BasicTimeProfiler:
    """Ignite's ``BasicTimeProfiler``: each iteration's step and data times, and each event's handlers' time.

    At STARTED the run's handlers are wrapped with a clock (handlers added later are not timed) and arrays are made
    for the run's iterations and epochs, so the run's length must be known (``epoch_length``); at COMPLETED they are
    unwrapped. `get_results` gives Ignite's dict (``total``, ``min/index``, ``max/index``, ``mean``, ``std`` of the
    non-zero times, in seconds), `print_results` Ignite's text, `write_results` Ignite's CSV (one row per iteration;
    written with the standard library, where Ignite needs pandas). The step time of a compiled trainer is its
    dispatch, not the device's work (asynchronous); see ``Throughput`` for that.

    Args:
        clock: seconds since some origin; injectable for tests.

    Examples:
        >>> from ember import Engine, Events
        >>> from ember.handlers import BasicTimeProfiler
        >>> engine = Engine(lambda e, b: b)
        >>> _ = engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: None)
        >>> profiler = BasicTimeProfiler()
        >>> _ = profiler.attach(engine)
        >>> _ = engine.run(range(3), max_epochs=2)
        >>> results = profiler.get_results()
        >>> sorted(results), results["event_handlers_names"]["ITERATION_COMPLETED_names"]
        (['dataflow_stats', 'event_handlers_names', 'event_handlers_stats', 'processing_stats'], ['<lambda>'])
    """

    events_to_ignore = (
        Events.EXCEPTION_RAISED,
        Events.TERMINATE,
        Events.TERMINATE_SINGLE_EPOCH,
        Events.DATALOADER_STOP_ITERATION,
        Events.INTERRUPT,
    )

    def __init__(self, *, clock: Callable[[], float] = time.perf_counter) -> None:
        if not callable(clock):
            raise TypeError(f"`clock` must be callable as clock() -> seconds, got {clock!r}.")
        self.clock = clock
        self.max_epochs = self.total_num_iters = 0
        self.processing_times = np.zeros(0)
        self.dataflow_times = np.zeros(0)
        self.event_handlers_times: dict[Events, np.ndarray] = {e: np.zeros(0) for e in EVENTS}
        self.event_handlers_names: dict[Events, list[str]] = {e: [] for e in EVENTS}
        self._mark = 0.0
        self._undo: Callable[[], None] | None = None

    def _index(self, engine: Engine, event: Events) -> int:
        st = engine.state
        if event in _PER_RUN:
            return 0
        if event in _PER_EPOCH:
            return st.epoch - 1
        # GET_BATCH_* fire before the iteration is counted
        return st.iteration if event in (Events.GET_BATCH_STARTED, Events.GET_BATCH_COMPLETED) else st.iteration - 1

    def _wrap(self, event: Any, handler: Callable[..., Any], call: Callable[..., Any]) -> Callable[..., Any]:
        if event not in EVENTS:
            return call
        self.event_handlers_names[event].append(handler_name(handler))
        times, clock = self.event_handlers_times[event], self.clock

        def timed(engine: Any, *args: Any) -> Any:
            start = clock()
            try:
                return call(engine, *args)
            finally:
                i = self._index(engine, event)
                if i < len(times):
                    times[i] += clock() - start

        return timed

    def _started(self, engine: Engine) -> None:
        st = engine.state
        if st.epoch_length is None:
            raise ValueError(
                "BasicTimeProfiler needs the run's length: the data has no len(); pass run(..., epoch_length=N)."
            )
        epochs = st.max_epochs if st.max_epochs is not None else math.ceil((st.max_iters or 0) / st.epoch_length)
        self.max_epochs, self.total_num_iters = epochs, epochs * st.epoch_length
        self.processing_times = np.zeros(self.total_num_iters)
        self.dataflow_times = np.zeros(self.total_num_iters)
        for e in EVENTS:
            size = 1 if e in _PER_RUN else epochs if e in _PER_EPOCH else self.total_num_iters
            self.event_handlers_times[e] = np.zeros(size)
            self.event_handlers_names[e] = []
        if self._undo is not None:  # the last run ended in an exception: its wrappers are still there
            self._undo()
        own = {self._started, self._mark_now, self._data_done, self._step_done, self._finished}
        self._undo = engine.wrap_handlers(lambda e, h, call: call if h in own else self._wrap(e, h, call))

    def _mark_now(self) -> None:
        self._mark = self.clock()

    def _data_done(self, engine: Engine) -> None:
        if engine.state.iteration < self.total_num_iters:
            self.dataflow_times[engine.state.iteration] = self.clock() - self._mark

    def _step_done(self, engine: Engine) -> None:
        if engine.state.iteration <= self.total_num_iters:
            self.processing_times[engine.state.iteration - 1] = self.clock() - self._mark

    def _finished(self) -> None:
        if self._undo is not None:
            self._undo()
            self._undo = None

    def attach(self, engine: Engine) -> RemovableEventHandle:
        """Profile ``engine``'s runs; return one handle whose ``remove()`` stops it (Ignite's returns ``None``).

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import BasicTimeProfiler
            >>> BasicTimeProfiler().attach(Engine(lambda e, b: b)).remove()
        """
        if not isinstance(engine, Engine):
            raise TypeError(f"BasicTimeProfiler.attach takes an ember Engine, got {type(engine).__name__}.")
        return attach_clocks(engine, self)

    def get_results(self) -> dict[str, dict[str, Any]]:
        """Ignite's aggregated results: the step's, the data's and each event's handlers' statistics, and their names.

        ``processing_stats``, ``dataflow_stats``, ``event_handlers_stats`` (per event, and ``total_time``),
        ``event_handlers_names``.

        Examples:
            >>> from ember.handlers import BasicTimeProfiler
            >>> BasicTimeProfiler().get_results()["processing_stats"]
            {'total': 'not yet triggered'}
        """
        handlers: dict[str, Any] = {e.name: basic_stats(self.event_handlers_times[e]) for e in EVENTS}
        handlers["total_time"] = float(sum(t.sum() for t in self.event_handlers_times.values()))
        return {
            "processing_stats": basic_stats(self.processing_times),
            "dataflow_stats": basic_stats(self.dataflow_times),
            "event_handlers_stats": handlers,
            "event_handlers_names": {f"{e.name}_names": list(self.event_handlers_names[e]) for e in EVENTS},
        }

    def write_results(self, output_path: str | os.PathLike[str]) -> None:
        """Write one CSV row per iteration, in Ignite's columns.

        The columns: epoch, iteration, the step, the data, each event's handlers (a run-wide or epoch-wide time
        repeated on its iterations' rows).

        Examples:
            >>> import tempfile, os
            >>> from ember import Engine
            >>> from ember.handlers import BasicTimeProfiler
            >>> engine, profiler = Engine(lambda e, b: b), BasicTimeProfiler()
            >>> _ = profiler.attach(engine)
            >>> _ = engine.run([1, 2])
            >>> path = os.path.join(tempfile.mkdtemp(), "profile.csv")
            >>> profiler.write_results(path)
            >>> from pathlib import Path
            >>> Path(path).read_text().splitlines()[0].split(",")[:4]
            ['epoch', 'iteration', 'processing_stats', 'dataflow_stats']
        """
        n, per_epoch = self.total_num_iters, self.total_num_iters // max(self.max_epochs, 1)
        t = self.event_handlers_times
        columns = {
            "epoch": np.repeat(np.arange(1, self.max_epochs + 1, dtype=float), per_epoch),
            "iteration": np.arange(1, n + 1, dtype=float),
            "processing_stats": self.processing_times,
            "dataflow_stats": self.dataflow_times,
            **{f"Event_{e.name}": np.repeat(t[e], n) for e in _PER_RUN},
            **{f"Event_{e.name}": np.repeat(t[e], per_epoch) for e in _PER_EPOCH},
            **{f"Event_{e.name}": t[e] for e in _PER_ITERATION},
        }
        with open(output_path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            writer.writerows(zip(*(c.tolist() for c in columns.values()), strict=True))

    @staticmethod
    def print_results(results: dict[str, Any]) -> str:
        """Print Ignite's table of `get_results`'s ``results``, and return it.

        Examples:
            >>> from ember.handlers import BasicTimeProfiler
            >>> text = BasicTimeProfiler.print_results(BasicTimeProfiler().get_results())  # doctest: +ELLIPSIS
            <BLANKLINE>
             ----------------------------------------------------
            | Time profiling stats (in seconds):                 |
            ...
        """
        stats = results["event_handlers_stats"]
        lines = [
            "",
            " ----------------------------------------------------",
            "| Time profiling stats (in seconds):                 |",
            " ----------------------------------------------------",
            "total  |  min/index  |  max/index  |  mean  |  std",
            "",
            "Processing function:",
            _row(results["processing_stats"]),
            "",
            "Dataflow:",
            _row(results["dataflow_stats"]),
            "",
            "Event handlers:",
            _value(stats["total_time"]),
        ]
        for name in ("STARTED", "EPOCH_STARTED", "ITERATION_STARTED", "ITERATION_COMPLETED", "EPOCH_COMPLETED"):
            lines += ["", f"- Events.{name}: {results['event_handlers_names'][name + '_names']}", _row(stats[name])]
        lines += ["", f"- Events.COMPLETED: {results['event_handlers_names']['COMPLETED_names']}"]
        lines += [_row(stats["COMPLETED"]), ""]
        text = "\n".join(lines)
        print(text)
        return text


def basic_stats(times: np.ndarray) -> dict[str, Any]:
    """Ignite's statistics of the non-zero ``times``.

    ``total``, and with two or more ``min/index``, ``max/index``, ``mean`` and ``std`` (the sample's); ``"not yet
    triggered"`` when none.
    """
    data = times[times > 0]
    if len(data) == 0:
        return {"total": "not yet triggered"}
    out: dict[str, Any] = {"total": float(data.sum())}
    if len(data) > 1:
        out["min/index"] = (float(data.min()), int(data.argmin()))
        out["max/index"] = (float(data.max()), int(data.argmax()))
        out["mean"] = float(data.mean())
        out["std"] = float(data.std(ddof=1))
    return out


def _value(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, tuple):
        return f"{v[0]:.5f}/{v[1]}"
    return f"{v:.5f}"


def _row(stats: dict[str, Any]) -> str:
    return " | ".join(_value(v) for v in stats.values())
