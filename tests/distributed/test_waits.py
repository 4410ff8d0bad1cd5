"""Every wait where the processes meet outside the compiled step is bounded, and names who did not come.

Unit tests on a coordination client of our own (the exchange's rounds, the total deadline, the watchdog's answer);
the waits on 2 real processes are in tests/cli/test_distributed.py.
"""

import threading
import time

import jax
import pytest

from ember import Engine, Events
from ember import _multiprocess as multiprocess
from ember._multiprocess import exchange, wait_timeout
from ember.errors import ProcessesMissing
from ember.handlers import ProcessWatchdog
from ember.handlers._resilience import watchdog as watchdog_module


class Client:
    """A coordination client whose key-value store holds the values of the processes ``published`` names.

    A get of a missing key waits for its timeout, then fails as the runtime's does (DEADLINE_EXCEEDED). ``hang``
    makes every lookup wait forever (a stopped service).
    """

    def __init__(self, published: set[int], hang: bool = False) -> None:
        self.published, self.hang, self.store = published, hang, {}
        self.waited: list[float] = []

    def key_value_set(self, key, value):
        self.store[key] = value

    def blocking_key_value_get(self, key, timeout_ms):
        process = int(key.rsplit("/", 1)[1])
        if key in self.store or process in self.published:
            return self.store.get(key, f"from {process}")
        self.waited.append(timeout_ms / 1000)
        time.sleep(timeout_ms / 1000)
        raise RuntimeError("DEADLINE_EXCEEDED: Deadline Exceeded")

    def key_value_delete(self, key):
        self.store.pop(key, None)

    def get_live_nodes(self, processes):
        return dict.fromkeys(processes, 0)

    def key_value_try_get(self, key):
        if self.hang:
            threading.Event().wait()
        raise RuntimeError("NOT_FOUND")


@pytest.fixture
def three_processes(monkeypatch):
    """This process is process 0 of 3, with the client the test gives."""
    monkeypatch.setattr(jax, "process_count", lambda: 3)
    monkeypatch.setattr(jax, "process_index", lambda: 0)

    def use(client):
        monkeypatch.setattr(multiprocess, "coordination_client", lambda: client)
        monkeypatch.setattr(watchdog_module, "coordination_client", lambda: client)
        return client

    return use


def test_an_exchange_names_every_process_that_did_not_come_within_one_deadline_in_all(three_processes):
    """Processes 1 and 2 never publish: one ProcessesMissing naming both, after the timeout once, not once each."""
    client = three_processes(Client(published=set()))
    started = time.monotonic()
    with pytest.raises(ProcessesMissing) as missing:
        exchange("commit:/runs/a", "mine", timeout=0.5)
    took = time.monotonic() - started
    assert str(missing.value) == (
        "processes 1, 2 did not reach 'commit:/runs/a' within 0.5 s (EMBER_WAIT_TIMEOUT): stalled, stuck or lost"
    )
    assert (missing.value.missing, missing.value.point) == ([1, 2], "commit:/runs/a")
    assert client.waited[0] == pytest.approx(0.5, abs=0.05)
    assert client.waited[1] <= 0.05  # past the deadline: only whether process 2 is there now
    assert took < 2.0


def test_an_exchange_everyone_comes_to_returns_every_value(three_processes):
    three_processes(Client(published={1, 2}))
    assert exchange("agree", "mine", timeout=0.5) == ["mine", "from 1", "from 2"]


def test_the_wait_timeout_comes_from_ember_wait_timeout(three_processes, monkeypatch):
    """EMBER_WAIT_TIMEOUT=0.3 bounds an exchange without its own timeout; a bad value is refused naming it."""
    client = three_processes(Client(published={2}))
    monkeypatch.setenv("EMBER_WAIT_TIMEOUT", "0.3")
    with pytest.raises(ProcessesMissing, match=r"^process 1 did not reach 'x' within 0\.3 s \(EMBER_WAIT_TIMEOUT\)"):
        exchange("x", "mine")
    assert client.waited == [pytest.approx(0.3, abs=0.05)]
    for bad in ("0", "-5", "soon", "inf"):
        with pytest.raises(
            ValueError, match=rf"^EMBER_WAIT_TIMEOUT must be a positive number of seconds, got '{bad}'\.$"
        ):
            wait_timeout({"EMBER_WAIT_TIMEOUT": bad})


def test_start_distributed_refuses_a_bad_wait_timeout_before_starting_anything(monkeypatch):
    from unittest import mock

    from ember.cli._distributed import start_distributed

    with mock.patch("jax.distributed.initialize") as started, pytest.raises(ValueError, match="EMBER_WAIT_TIMEOUT"):
        start_distributed({"EMBER_WAIT_TIMEOUT": "0"})
    started.assert_not_called()


def test_the_watchdog_names_the_processes_a_wait_ran_out_on_and_ends_75(three_processes, capsys):
    """A ProcessesMissing raised in the run (a checkpoint's commit): the watchdog's line names process 2, exit 75."""
    three_processes(Client(published={1, 2}))
    ended = []
    watchdog = ProcessWatchdog(exit=ended.append)
    trainer = Engine(lambda e, b: b)
    watchdog.attach(trainer)

    @trainer.on(Events.ITERATION_COMPLETED)
    def commit(engine):
        raise ProcessesMissing([2], "commit:/runs/a", 5.0)

    with pytest.raises(ProcessesMissing):
        trainer.run([1, 2])
    assert ended == [75]
    assert capsys.readouterr().err == (
        "ember: process 2 of this 3-process run was lost (it did not reach 'commit:/runs/a' within 5 s "
        "(EMBER_WAIT_TIMEOUT)). Process 0 stops here with exit status 75: relaunching resumes from what it recorded. "
        "Relaunch every process.\n"
    )


def test_a_coordination_service_that_does_not_answer_in_time_names_process_0(three_processes, capsys):
    """The lookup hangs (process 0 stopped): after answer_within, process 0 is named; a live service is not."""
    three_processes(Client(published={1, 2}, hang=True))
    ended = []
    watchdog = ProcessWatchdog(answer_within=0.3, exit=ended.append)
    started = time.monotonic()
    assert watchdog._ping() is True
    assert 0.3 <= time.monotonic() - started < 2.0
    assert ended == [75]
    assert capsys.readouterr().err.startswith(
        "ember: process 0 of this 3-process run was lost (the coordination service on process 0 did not answer "
        "within 0.3 s: process 0 stalled or was lost). Process 0 stops here"
    )
    three_processes(Client(published={1, 2}))
    assert ProcessWatchdog(answer_within=0.3, exit=ended.append)._ping() is False
    assert ended == [75]
