"""BasicTimeProfiler: Ignite 0.5.5's results, exactly, from a clock the run itself moves.

Ignite's key names and order (recorded with pytorch-ignite 0.5.5, a run of 3 iterations for 2 epochs with one
ITERATION_COMPLETED handler): results ``['processing_stats', 'dataflow_stats', 'event_handlers_stats',
'event_handlers_names']``; handler stats ``['EPOCH_STARTED', 'EPOCH_COMPLETED', 'STARTED', 'COMPLETED',
'ITERATION_STARTED', 'ITERATION_COMPLETED', 'GET_BATCH_STARTED', 'GET_BATCH_COMPLETED', 'total_time']``; each
stat ``['total', 'min/index', 'max/index', 'mean', 'std']``.
"""

import csv
import re

import pytest

from ember import Engine, Events
from ember.handlers import BasicTimeProfiler


def profiled_run(tmp_path=None):
    now = [0.0]

    def advance(seconds):
        now[0] += seconds

    class Data:
        def __iter__(self):
            for i in range(3):
                advance(0.25)  # the data's next: 0.25 s
                yield i

    engine = Engine(lambda e, b: advance(0.5))  # the step: 0.5 s
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda: advance(0.125))

    def log(engine):
        advance(1.0)

    engine.add_event_handler(Events.EPOCH_COMPLETED, log)
    profiler = BasicTimeProfiler(clock=lambda: now[0])
    profiler.attach(engine)
    engine.run(Data(), max_epochs=2, epoch_length=3)
    return profiler


def test_results_are_ignites_with_each_time_where_it_was_spent():
    results = profiled_run().get_results()
    assert list(results) == ["processing_stats", "dataflow_stats", "event_handlers_stats", "event_handlers_names"]
    assert results["processing_stats"] == {
        "total": 3.0, "min/index": (0.5, 0), "max/index": (0.5, 0), "mean": 0.5, "std": 0.0,
    }  # fmt: skip
    assert results["dataflow_stats"]["total"] == 1.5
    handlers = results["event_handlers_stats"]
    assert list(handlers) == [
        "EPOCH_STARTED", "EPOCH_COMPLETED", "STARTED", "COMPLETED", "ITERATION_STARTED", "ITERATION_COMPLETED",
        "GET_BATCH_STARTED", "GET_BATCH_COMPLETED", "total_time",
    ]  # fmt: skip
    assert handlers["ITERATION_COMPLETED"]["total"] == 0.75
    assert handlers["EPOCH_COMPLETED"] == {
        "total": 2.0, "min/index": (1.0, 0), "max/index": (1.0, 0), "mean": 1.0, "std": 0.0,
    }  # fmt: skip
    assert handlers["STARTED"] == {"total": "not yet triggered"}
    assert handlers["total_time"] == 2.75
    names = results["event_handlers_names"]
    assert names["ITERATION_COMPLETED_names"] == ["profiled_run.<locals>.<lambda>"]
    assert names["EPOCH_COMPLETED_names"] == ["profiled_run.<locals>.log"]
    assert names["STARTED_names"] == []  # the profiler's own handlers are left out


def test_write_results_is_ignites_csv_one_row_per_iteration(tmp_path):
    profiled_run().write_results(tmp_path / "profile.csv")
    rows = list(csv.reader((tmp_path / "profile.csv").read_text().splitlines()))
    assert rows[0] == [
        "epoch", "iteration", "processing_stats", "dataflow_stats", "Event_STARTED", "Event_COMPLETED",
        "Event_EPOCH_STARTED", "Event_EPOCH_COMPLETED", "Event_ITERATION_STARTED", "Event_ITERATION_COMPLETED",
        "Event_GET_BATCH_STARTED", "Event_GET_BATCH_COMPLETED",
    ]  # fmt: skip
    assert [[float(x) for x in row] for row in rows[1:]] == [
        [e, i, 0.5, 0.25, 0.0, 0.0, 0.0, 1.0, 0.0, 0.125, 0.0, 0.0]
        for e, i in ((1, 1), (1, 2), (1, 3), (2, 4), (2, 5), (2, 6))
    ]


def test_print_results_prints_ignites_table(capsys):
    profiler = profiled_run()
    text = BasicTimeProfiler.print_results(profiler.get_results())
    assert capsys.readouterr().out == text + "\n"
    assert "Processing function:\n3.00000 | 0.50000/0 | 0.50000/0 | 0.50000 | 0.00000\n" in text
    assert "- Events.EPOCH_COMPLETED: ['profiled_run.<locals>.log']\n2.00000 | 1.00000/0" in text
    assert "- Events.COMPLETED: []\nnot yet triggered\n" in text


def test_a_run_of_unknown_length_is_refused_with_the_fix():
    engine = Engine(lambda e, b: b)
    BasicTimeProfiler().attach(engine)
    with pytest.raises(ValueError, match=re.escape("BasicTimeProfiler needs the run's length")):
        engine.run(iter([1, 2]))
