"""A run ended by a handler's decision (terminate()) is complete for a relaunch; Preemption's stop is not."""

import warnings

import pytest

from ember import Engine, Events
from ember.handlers import Checkpoint, EarlyStopping

ENDED = (
    "The run loaded by load_state_dict() was ended by terminate() at epoch 2, iteration 13 (a handler's decision: "
    "early stopping, a time limit, a NaN); run() does nothing. To train on from there, set engine.should_terminate = "
    "False first; to start over, set engine.state.max_epochs = None to restart from zero."
)


def stopped_at_13(final=True):
    engine = Engine(lambda e, b: b)
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=13), lambda e: e.terminate(final=final))
    engine.run(range(10), max_epochs=5)
    return engine


def test_in_the_same_process_run_continues_after_terminate_as_ignite():
    engine = stopped_at_13()
    assert engine.should_terminate is True
    assert engine.state_dict() == {"epoch_length": 10, "iteration": 13, "max_epochs": 5, "terminated": True}
    assert engine.run().iteration == 50
    assert "terminated" not in engine.state_dict()


def test_a_relaunch_of_a_terminated_run_does_nothing_until_told_to_train_on():
    saved = stopped_at_13().state_dict()
    fresh = Engine(lambda e, b: b)
    seen = []
    fresh.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(e.state.iteration))
    fresh.load_state_dict(saved)
    assert fresh.should_terminate is True
    with pytest.warns(UserWarning, match=r"^The run loaded by load_state_dict\(\) was ended") as record:
        state = fresh.run(range(10))
    assert [str(w.message) for w in record] == [ENDED]
    assert (state.iteration, state.epoch, seen) == (13, 2, [])
    fresh.should_terminate = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fresh.run(range(10)).iteration == 50
    assert seen == list(range(14, 51))


def test_a_stop_that_is_not_final_is_resumed_by_a_relaunch():
    """Preemption's terminate(final=False): the saved state says nothing, and a relaunch trains on."""
    engine = stopped_at_13(final=False)
    assert engine.should_terminate is True
    saved = engine.state_dict()
    assert saved == {"epoch_length": 10, "iteration": 13, "max_epochs": 5}
    fresh = Engine(lambda e, b: b)
    fresh.load_state_dict(saved)
    assert fresh.should_terminate is False
    assert fresh.run(range(10)).iteration == 50


@pytest.mark.parametrize("limit", [{"max_epochs": 2}, {"max_iters": 4}])
def test_a_stop_at_the_run_s_last_iteration_leaves_its_epoch_end_and_completion_to_the_relaunch(limit):
    """Stopped (not final) at the last iteration, before its EPOCH_COMPLETED: the relaunch fires what the run owes."""

    def engine_seeing(seen):
        engine = Engine(lambda e, b: b)
        for event in (Events.EPOCH_COMPLETED, Events.COMPLETED):
            engine.add_event_handler(event, lambda e, name=event.value: seen.append((name, e.state.iteration)))
        return engine

    straight = []
    engine_seeing(straight).run([1, 2], **limit)
    first = []
    stopped = engine_seeing(first)
    stopped.add_event_handler(Events.ITERATION_COMPLETED(once=4), lambda e: e.terminate(final=False))
    stopped.run([1, 2], **limit)
    saved = stopped.state_dict()
    assert saved == {"epoch_length": 2, "iteration": 4, **limit, "epoch_completed": False}
    second = []
    relaunched = engine_seeing(second)
    relaunched.load_state_dict(saved)
    assert relaunched.run([1, 2]).iteration == 4
    assert straight == [("epoch_completed", 2), ("epoch_completed", 4), ("completed", 4)]
    assert first == [("epoch_completed", 2), ("completed", 4)]  # the stop's own end: the writers flush
    assert second == [("epoch_completed", 4), ("completed", 4)]  # before: nothing, "already complete" (max_iters)


def test_a_trainer_stopped_early_and_resumed_from_its_checkpoint_trains_no_further(tmp_path):
    """The checkpoints page's relaunch (resume(), then run()) after EarlyStopping stopped the run at epoch 4."""
    scores = [0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6]

    def launch():
        trainer, evaluator = Engine(lambda e, b: b), Engine(lambda e, b: b)
        evaluator.add_event_handler(
            Events.COMPLETED, lambda e: e.state.metrics.update(score=scores[trainer.state.epoch - 1])
        )
        trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: evaluator.run([0]))
        stopper = EarlyStopping(2, lambda e: e.state.metrics["score"], trainer)
        stopper.attach(evaluator)
        saver = Checkpoint({"trainer": trainer, "stopper": stopper}, tmp_path, background=False)
        saver.attach(trainer, Events.EPOCH_COMPLETED | Events.COMPLETED)
        epochs = []
        trainer.add_event_handler(Events.EPOCH_STARTED, lambda e: epochs.append(e.state.epoch))
        return trainer, saver, epochs

    trainer, _, epochs = launch()
    trainer.run(range(3), max_epochs=8)
    assert (trainer.state.epoch, epochs) == (4, [1, 2, 3, 4])
    again, saver, epochs = launch()
    assert saver.resume().step == 12
    assert again.should_terminate is True
    with pytest.warns(
        UserWarning, match=r"^The run loaded by load_state_dict\(\) was ended by terminate\(\) at epoch 4"
    ):
        state = again.run(range(3), max_epochs=8)
    assert (state.epoch, state.iteration, epochs) == (4, 12, [])
