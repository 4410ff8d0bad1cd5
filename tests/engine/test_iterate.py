import pytest

from ember import Engine, Events
from tests.engine.recording import batches_seen, recording_engine


def test_iterate_yields_the_state_each_time_the_event_fires():
    """iterate() yields after every firing of the filtered event, all its handlers having run."""
    trainer = Engine(lambda e, b: b * 10)
    order = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED(every=25), lambda e: order.append("handler"))
    got = []
    for state in trainer.iterate(range(50), Events.ITERATION_COMPLETED(every=25), max_epochs=4):
        order.append("loop")
        got.append((state.epoch, state.iteration, state.output))
    assert got == [
        (1, 25, 240),
        (1, 50, 490),
        (2, 75, 240),
        (2, 100, 490),
        (3, 125, 240),
        (3, 150, 490),
        (4, 175, 240),
        (4, 200, 490),
    ]
    assert order == ["handler", "loop"] * 8
    assert not trainer.has_event_handler(trainer._request_pause)


def test_iterate_on_completed_yields_once_at_the_end():
    """An iterate() on COMPLETED yields exactly once, after the run's last event."""
    engine, log = recording_engine()
    states = [s.iteration for s in engine.iterate([1, 2], Events.COMPLETED, max_epochs=3)]
    assert states == [6]
    assert log[-1] == "COMPLETED"


def test_breaking_out_of_iterate_leaves_the_engine_resumable():
    """Leaving the loop early works like interrupt(): run() continues without a second STARTED."""
    engine, log = recording_engine()
    seen = batches_seen(engine)
    for state in engine.iterate(range(4), Events.ITERATION_COMPLETED(every=3), max_epochs=2):
        if state.iteration == 3:
            break
    assert engine.state.iteration == 3
    state = engine.run()
    assert state.iteration == 8
    assert log.count("STARTED") == 1
    assert [b for _, _, b in seen] == [0, 1, 2, 3] * 2


def test_iterate_can_be_resumed_by_another_iterate():
    """A second iterate() continues the run the first one left."""
    engine = Engine(lambda e, b: b)
    it = engine.iterate([1, 2, 3], Events.EPOCH_COMPLETED, max_epochs=3)
    assert next(it).epoch == 1
    it.close()
    assert [s.epoch for s in engine.iterate(None, Events.EPOCH_COMPLETED)] == [2, 3]


def test_terminate_inside_the_loop_body_ends_the_run_cleanly():
    """Calling terminate() in the loop body ends the run with TERMINATE and COMPLETED."""
    engine, log = recording_engine()
    for state in engine.iterate([1, 2, 3], Events.ITERATION_COMPLETED, max_epochs=5):
        if state.iteration == 4:
            engine.terminate()
    assert engine.state.iteration == 4
    assert log[-3:] == ["ITERATION_COMPLETED", "TERMINATE", "COMPLETED"]


def test_iterate_validates_its_arguments_before_the_first_step():
    """Bad arguments to iterate() raise at the call, not at the first next()."""
    engine = Engine(lambda e, b: b)
    with pytest.raises(TypeError, match=r"iterate\(\) got unexpected arguments \['max_epoch'\]"):
        engine.iterate([1], Events.COMPLETED, max_epoch=2)
    with pytest.raises(
        TypeError, match=r"Expected an event \(Events.X, Events.X\(...\), or a registered name\), got 3"
    ):
        engine.iterate([1], 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"'completed' is not an event of this engine"):
        engine.iterate([1], "completed")
    with pytest.raises(ValueError, match=r"`max_epochs` must be a positive int, got -1"):
        engine.iterate([1], Events.COMPLETED, max_epochs=-1)
