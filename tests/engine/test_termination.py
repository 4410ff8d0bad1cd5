import contextlib
from collections.abc import Callable

import pytest

from ember import Engine, Events
from tests.engine import expectations as expect
from tests.engine.recording import batches_seen, recording_engine, terminated_at

# Where each scenario calls its method: (event, counter value) during run([10, 20, 30], max_epochs=2).
_CALLS: dict[str, tuple[Events, int, Callable[[Engine], None]]] = {
    "terminate() at ITERATION_COMPLETED": (Events.ITERATION_COMPLETED, 2, lambda e: e.terminate()),
    "terminate(skip_completed=True) at ITERATION_COMPLETED": (
        Events.ITERATION_COMPLETED,
        2,
        lambda e: e.terminate(skip_completed=True),
    ),
    "terminate() at STARTED": (Events.STARTED, 0, lambda e: e.terminate()),
    "terminate() at EPOCH_COMPLETED": (Events.EPOCH_COMPLETED, 1, lambda e: e.terminate()),
    "terminate_epoch() at ITERATION_COMPLETED": (Events.ITERATION_COMPLETED, 2, lambda e: e.terminate_epoch()),
    "terminate_epoch(skip_epoch_completed=True) at ITERATION_COMPLETED": (
        Events.ITERATION_COMPLETED,
        2,
        lambda e: e.terminate_epoch(skip_epoch_completed=True),
    ),
    "terminate_epoch() at GET_BATCH_STARTED": (Events.GET_BATCH_STARTED, 1, lambda e: e.terminate_epoch()),
    "terminate_epoch() at EPOCH_COMPLETED": (Events.EPOCH_COMPLETED, 1, lambda e: e.terminate_epoch()),
    "terminate_epoch() at EPOCH_STARTED": (Events.EPOCH_STARTED, 1, lambda e: e.terminate_epoch()),
    "terminate_epoch() at STARTED": (Events.STARTED, 0, lambda e: e.terminate_epoch()),
    "interrupt() at ITERATION_COMPLETED": (Events.ITERATION_COMPLETED, 2, lambda e: e.interrupt()),
}


def _events_after_call(scenario: str) -> list[str]:
    event, value, call = _CALLS[scenario]
    engine, log = recording_engine()
    marker = "<call>"

    def trigger(e: Engine) -> None:
        counter = (
            e.state.epoch
            if event in (Events.STARTED, Events.EPOCH_STARTED, Events.EPOCH_COMPLETED)
            else e.state.iteration
        )
        if counter == value and marker not in log:
            log.append(marker)
            call(e)

    engine.add_event_handler(event, trigger)  # after the recorder: the marker follows the event's own entry
    with contextlib.suppress(RuntimeError):  # terminate_epoch() too early: the rows show EXCEPTION_RAISED
        engine.run([10, 20, 30], max_epochs=2)
    after = log[log.index(marker) + 1 :]
    return after[: after.index("EPOCH_STARTED") + 1] if "EPOCH_STARTED" in after else after


@pytest.mark.parametrize("scenario", sorted(expect.TERMINATION))
def test_termination_table(scenario):
    """Each terminate/terminate_epoch/interrupt call is followed by exactly the documented events."""
    assert _events_after_call(scenario) == expect.TERMINATION[scenario]


def test_terminate_epoch_before_any_iteration_raises_runtime_error():
    """terminate_epoch() at EPOCH_STARTED makes run() raise, naming the fix."""
    engine = Engine(lambda e, b: b)
    engine.add_event_handler(Events.EPOCH_STARTED, lambda e: e.terminate_epoch())
    with pytest.raises(RuntimeError, match=r"terminate_epoch\(\) was called from a Events.EPOCH_STARTED handler"):
        engine.run([1, 2])


def test_terminate_epoch_moves_on_to_the_next_epoch_with_a_fresh_iterator():
    """After terminate_epoch the next epoch starts from the first batch."""
    engine = Engine(lambda e, b: b)
    seen = batches_seen(engine)
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=2), lambda e: e.terminate_epoch())
    state = engine.run([1, 2, 3], max_epochs=2)
    assert seen == [(1, 1, 1), (1, 2, 2), (2, 3, 1), (2, 4, 2), (2, 5, 3)]
    assert state.epoch == 2


def test_terminate_then_run_continues_and_processes_what_an_uninterrupted_run_would():
    """Terminated at iteration 13 of range(10) x 5, a second run ends at epoch 5, iteration 50 (Ignite: 43)."""
    straight = Engine(lambda e, b: b)
    expected = batches_seen(straight)
    straight.run(range(10), max_epochs=5)

    engine, log = recording_engine()
    seen = batches_seen(engine)
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=13), lambda e: e.terminate())
    state = engine.run(range(10), max_epochs=5)
    assert (state.epoch, state.iteration) == (2, 13)
    assert log[-2:] == ["TERMINATE", "COMPLETED"]
    assert engine.should_terminate is True
    log.clear()
    state = engine.run(range(10), max_epochs=5)
    assert (state.epoch, state.iteration) == (5, 50)
    assert seen == expected
    assert engine.should_terminate is False
    # the continued epoch does not start again: STARTED, then straight into its next batch
    assert log[:3] == ["STARTED", "GET_BATCH_STARTED", "GET_BATCH_COMPLETED"]
    assert log.count("EPOCH_STARTED") == 3
    assert log.count("EPOCH_COMPLETED") == 4


def test_terminate_at_epoch_completed_then_run_starts_the_next_epoch():
    """A run terminated after an epoch ended continues with the next epoch's EPOCH_STARTED."""
    engine, log = recording_engine()
    engine.add_event_handler(Events.EPOCH_COMPLETED(once=1), lambda e: e.terminate())
    engine.run([1, 2], max_epochs=3)
    log.clear()
    state = engine.run()
    assert log[:2] == ["STARTED", "EPOCH_STARTED"]
    assert (state.epoch, state.iteration) == (3, 6)


def test_interrupt_returns_and_resumes_with_the_same_iterator_and_no_second_started():
    """interrupt() returns from run(); the next run() resumes in place without STARTED."""
    engine, log = recording_engine()
    seen = batches_seen(engine)
    engine.add_event_handler(Events.ITERATION_COMPLETED(every=11), lambda e: e.interrupt())
    state = engine.run(range(10), max_epochs=3)
    assert (state.epoch, state.iteration) == (2, 11)
    assert log[-2:] == ["ITERATION_COMPLETED", "INTERRUPT"]
    log.clear()
    state = engine.run(range(10), max_epochs=3)
    assert (state.epoch, state.iteration) == (3, 22)
    assert "STARTED" not in log
    state = engine.run()
    assert (state.epoch, state.iteration) == (3, 30)
    assert [b for _, _, b in seen] == list(range(10)) * 3
    assert log.count("COMPLETED") == 1


def test_interrupt_can_extend_the_run_on_resume():
    """A larger max_epochs given when resuming after interrupt extends the run."""
    engine = Engine(lambda e, b: b)
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=2), lambda e: e.interrupt())
    engine.run([1, 2, 3], max_epochs=1)
    assert engine.run(max_epochs=2).iteration == 6


def test_run_again_with_larger_max_epochs_continues():
    """run(max_epochs=5) then run(max_epochs=7) ends at epoch 7 with 2 more epochs of batches."""
    engine, log = recording_engine()
    engine.run([1, 2], max_epochs=5)
    log.clear()
    state = engine.run([1, 2], max_epochs=7)
    assert (state.epoch, state.iteration) == (7, 14)
    assert log.count("EPOCH_STARTED") == 2


def test_run_again_with_smaller_max_epochs_than_reached_raises():
    """A max_epochs below the epoch reached is refused, naming the restart recipe."""
    engine = terminated_at(Events.EPOCH_COMPLETED(once=3), [1, 2], max_epochs=5)
    with pytest.raises(ValueError, match=r"`max_epochs`=2 is below the epoch this engine reached \(3\).*= None"):
        engine.run([1, 2], max_epochs=2)


def test_run_again_after_completion_restarts_from_zero():
    """A finished run followed by run() starts over at iteration 0, with STARTED."""
    engine, log = recording_engine()
    engine.run([1, 2], max_epochs=2)
    log.clear()
    state = engine.run([1, 2, 3], max_epochs=2)
    assert (state.epoch, state.iteration, state.epoch_length) == (2, 6, 3)
    assert log[:2] == ["STARTED", "EPOCH_STARTED"]
    assert log.count("ITERATION_COMPLETED") == 6
    state = engine.run([1, 2, 3])  # no max_epochs: the evaluator pattern, a fresh one-epoch run each time
    assert (state.epoch, state.iteration) == (1, 3)


def test_setting_max_epochs_to_none_forces_a_restart():
    """state.max_epochs = None makes the next run() start from zero even mid-run."""
    engine = terminated_at(Events.ITERATION_COMPLETED(once=3), [1, 2], max_epochs=5)
    engine.state.max_epochs = None
    state = engine.run([1, 2], max_epochs=1)
    assert (state.epoch, state.iteration) == (1, 2)


def test_continuing_with_a_different_epoch_length_is_refused():
    """epoch_length cannot change while continuing a run."""
    engine = terminated_at(Events.ITERATION_COMPLETED(once=1), [1, 2], max_epochs=3)
    with pytest.raises(ValueError, match=r"`epoch_length`=5 differs from the run being continued \(2\)"):
        engine.run([1, 2], epoch_length=5)


def test_terminate_flags_are_checked_after_all_handlers_of_the_event():
    """Handlers after the one that calls terminate() still run for that event."""
    engine = Engine(lambda e, b: b)
    ran = []
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: e.terminate())
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: ran.append(e.state.iteration))
    engine.run([1, 2, 3])
    assert ran == [1]


def test_process_function_can_terminate():
    """terminate() from the process function takes effect after ITERATION_COMPLETED."""

    def process(engine, batch):
        if batch == 2:
            engine.terminate()

    engine, log = recording_engine(process)
    state = engine.run([1, 2, 3])
    assert state.iteration == 2
    assert log[-3:] == ["ITERATION_COMPLETED", "TERMINATE", "COMPLETED"]
