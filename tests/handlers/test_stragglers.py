"""`StragglerReport`: the processes' host times compared each window; a laggard named once.

Here on one real process beside a scripted peer (the exchange's answer); on 2 real processes in
tests/cli/test_distributed.py.
"""

import json

import jax
import pytest

from ember import Engine, Events
from ember._ledger_file import read_records
from ember.cli import goodput_table
from ember.handlers import GoodputLedger, StragglerReport
from ember.handlers._reporting import stragglers as module


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Recorder:
    def __init__(self):
        self.scalars = []

    def write_scalars(self, step, values):
        self.scalars.append((step, dict(values)))


def run(
    monkeypatch, peer, *, iterations=12, fetch=0.001, step=0.010, patience=3, factor=2.0, writer=None, ledger_dir=None
):
    """``iterations`` on this process (process 0), in windows of 4, beside a scripted peer.

    Each iteration fetches for ``fetch`` seconds and steps for ``step``; ``peer(window)`` gives the peer's numbers
    (steps, step time, wall time).
    """
    clock = Clock()
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    windows = []

    def exchange(name, value):
        assert name == "stragglers"
        windows.append(json.loads(value))
        return [value, json.dumps(peer(len(windows)))]

    monkeypatch.setattr(module, "exchange", exchange)

    def process(engine, batch):
        clock.now += step
        return batch

    def data():
        for i in range(iterations):
            clock.now += fetch
            yield i

    trainer = Engine(process)
    said = []
    report = StragglerReport(writer, every=4, factor=factor, patience=patience, say=said.append, clock=clock)
    report.attach(trainer)
    if ledger_dir is not None:
        GoodputLedger(ledger_dir).attach(trainer, stragglers=report)
    trainer.run(data(), max_epochs=1, epoch_length=iterations)
    return said, report, windows


def slow(n: int) -> list[float]:
    """A peer's window of 4 steps: 2 ms stepping, 50 ms outside the step (its data iterator is slow)."""
    return [4, 0.008, 0.208]


def even(n: int) -> list[float]:
    return [4, 0.040, 0.044]


def test_a_process_that_lags_for_patience_windows_is_named_once_and_the_spread_is_written(monkeypatch):
    writer = Recorder()
    said, report, windows = run(monkeypatch, slow, writer=writer)
    assert windows == [[4, pytest.approx(0.04), pytest.approx(0.044)]] * 3
    assert said == [
        "ember: process 1 lags: for 3 windows of 4 iterations in a row (to iteration 12) its time outside the step "
        "was 50.0 ms per step against 1.0 ms for the others (its step 2.0 ms)."
    ]
    assert [step for step, _ in writer.scalars] == [4, 8, 12]
    assert writer.scalars[0][1] == {
        "stragglers/step_time/median": pytest.approx(0.006),
        "stragglers/step_time/max": pytest.approx(0.010),
        "stragglers/outside_step/median": pytest.approx(0.0255),
        "stragglers/outside_step/max": pytest.approx(0.050),
        "stragglers/slowest": 1,
    }
    summary = report.summary()
    assert (summary["windows"], summary["named"]) == (3, [1])
    assert summary["step_time"] == {"0": pytest.approx(0.010), "1": pytest.approx(0.002)}
    assert summary["outside_step"] == {"0": pytest.approx(0.001), "1": pytest.approx(0.050)}


def test_an_even_run_names_no_one(monkeypatch):
    """The peer's numbers equal this process's: no line, and the slowest is whichever is a hair slower."""
    said, report, _ = run(monkeypatch, even)
    assert (said, report.summary()["named"]) == ([], [])


def test_lagging_counts_only_windows_in_a_row(monkeypatch):
    """Lagging in windows 1, 2 and 4, not 3 (patience 3): nobody is named."""
    said, report, _ = run(monkeypatch, lambda n: even(n) if n == 3 else slow(n), iterations=16)
    assert (said, report.summary()["windows"]) == ([], 4)


def test_a_lag_under_a_tenth_of_a_step_is_not_one(monkeypatch):
    """The peer's own time 2.1 ms per step: over twice this process's 1 ms, but only 1.1 ms above it.

    A tenth of the median step (11.55 ms) is more: nobody is named.
    """
    said, _, _ = run(monkeypatch, lambda n: [4, 0.040, 0.0484])
    assert said == []


def test_factor_and_patience_take_their_values(monkeypatch):
    """The peer's own time 1.8 times this process's: with factor 2 nobody; with 1.5 and patience 2, at window 2.

    This process fetches for 10 ms and steps for 1 ms; the peer's own time is 18 ms per step.
    """
    peer = lambda n: [4, 0.004, 0.076]  # noqa: E731
    assert run(monkeypatch, peer, fetch=0.010, step=0.001)[0] == []
    said, _, _ = run(monkeypatch, peer, fetch=0.010, step=0.001, factor=1.5, patience=2)
    assert said == [
        "ember: process 1 lags: for 2 windows of 4 iterations in a row (to iteration 8) its time outside the step "
        "was 18.0 ms per step against 10.0 ms for the others (its step 1.0 ms)."
    ]


def test_one_process_attaches_nothing():
    trainer = Engine(lambda e, b: b)
    report = StragglerReport()
    report.attach(trainer)
    assert not trainer.has_event_handler(report._stepped, Events.ITERATION_COMPLETED)
    assert not trainer.has_event_handler(report._stepping, Events.ITERATION_STARTED)


def test_the_ledger_keeps_the_spread_and_ember_goodput_shows_it(monkeypatch, tmp_path):
    run(monkeypatch, slow, ledger_dir=tmp_path)
    record = read_records(tmp_path)[-1]
    assert record["stragglers"]["named"] == [1]
    lines = goodput_table(tmp_path).splitlines()
    start = lines.index("processes (ms per step, every run that compared them):")
    assert lines[start + 1 : start + 4] == [
        "  step       median 6.00, slowest 10.00 (process 0)",
        "  outside it median 25.50, slowest 50.00 (process 1)",
        "  lagging: process 1",
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every": 0}, "`every` must be a positive number of iterations, got 0."),
        ({"factor": 1}, "`factor` must be a number above 1, got 1."),
        ({"patience": 0}, "`patience` must be a positive number of windows, got 0."),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message.replace('(', '[(]').replace(')', '[)]')}$".replace(".", r"\.")):
        StragglerReport(**kwargs)


def test_ember_train_refuses_a_straggler_window_of_0_naming_the_key():
    from ember.cli import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"^handlers\.stragglers\.every: expected a positive int, got 0\.$"):
        load_config({"handlers": {"stragglers": {"every": 0}}})
    assert load_config({"handlers": {"stragglers": None}}).handlers.stragglers is None
