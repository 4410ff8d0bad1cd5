"""Ignite 0.5.5's documented behaviour and public engine names, run as a migrating user's code runs them.

Each test runs the lines of Ignite's example or behaviour and asserts Ignite's result (read from its source at tag
v0.5.5: ``ignite/engine/engine.py``, ``events.py``, ``handlers/time_limit.py``, ``handlers/checkpoint.py``).
"""

import gc
import logging
import re
import weakref

import jax.numpy as jnp
import pytest

from ember import Engine, EventEnum, Events, State
from ember.handlers import DiskSaver, TerminateOnNan, TimeLimit


def test_the_last_output_outlives_the_end_of_the_data():
    """``e.run(x for x in [1, 2, 3]); e.state.output`` is 30, and EPOCH_COMPLETED/COMPLETED handlers read it."""
    e = Engine(lambda e, b: b * 10)
    seen = []
    e.add_event_handler(Events.EPOCH_COMPLETED | Events.COMPLETED, lambda e: seen.append(e.state.output))
    e.run(x for x in [1, 2, 3])
    assert (e.state.output, seen) == (30, [30, 30])
    e = Engine(lambda e, b: b * 10)  # cleared once the next batch came: a fetch still sees the last output
    seen = []
    for event in (Events.GET_BATCH_STARTED, Events.ITERATION_STARTED):
        e.add_event_handler(event, lambda e, event=event: seen.append((event.name[:4], e.state.output)))
    e.run([1, 2], max_epochs=2)
    fetched = [("GET_", None), ("GET_", 10), ("GET_", 20), ("GET_", 10)]
    assert seen == [pair for fetch in fetched for pair in (fetch, ("ITER", None))]


class _NoLen:
    """A torch DataLoader over an IterableDataset: iterable again, and ``len()`` raises TypeError."""

    def __iter__(self):
        return iter([1, 2, 3])

    def __len__(self):
        raise TypeError("this loader has no length")


def test_data_whose_len_raises_type_error_runs_as_unknown_length():
    """Ignite's ``_get_data_length`` returns None on TypeError: the length is learned at the end of epoch 1."""
    e = Engine(lambda e, b: b)
    lengths = []
    e.add_event_handler(Events.EPOCH_COMPLETED, lambda e: lengths.append(e.state.epoch_length))
    state = e.run(_NoLen(), max_epochs=2)
    assert (state.iteration, state.epoch, lengths) == (6, 2, [3, 3])


def test_switching_a_finished_run_between_max_epochs_and_max_iters_needs_a_reset():
    """``run(max_epochs=5)`` then ``run(max_iters=500)`` raises ValueError (and back); after the reset it runs."""
    e = Engine(lambda e, b: b)
    e.run(range(100), max_epochs=5)
    with pytest.raises(ValueError, match=re.escape("first reset with engine.state.max_epochs = None")):
        e.run(range(100), max_iters=500)
    assert (e.state.iteration, e.state.max_epochs, e.state.max_iters) == (500, 5, None)  # untouched
    e.state.max_epochs = None
    assert (e.run(range(100), max_iters=500).iteration, e.state.max_epochs) == (500, None)
    with pytest.raises(ValueError, match=re.escape("first reset with engine.state.max_iters = None")):
        e.run(range(100), max_epochs=6)
    e.state.max_iters = None
    assert e.run(range(100), max_epochs=6).iteration == 600


def test_a_max_iters_run_leaves_max_epochs_none_and_continues_by_iterations():
    """Ignite sets ``max_epochs = None`` for a max_iters run (data of known and of unknown length)."""
    e = Engine(lambda e, b: b)
    e.add_event_handler(Events.ITERATION_COMPLETED(once=4), lambda e: e.terminate())
    state = e.run(range(3), max_iters=7)
    assert (state.iteration, state.max_epochs, state.max_iters) == (4, None, 7)
    assert (e.run(range(3), max_iters=8).iteration, e.state.max_epochs) == (8, None)
    assert Engine(lambda e, b: b).run(_NoLen(), max_iters=5).max_epochs is None
    assert e.state_dict() == {"epoch_length": 3, "iteration": 8, "max_iters": 8}


def test_a_filtered_events_filter_is_the_function_given():
    def every_third(engine, event):
        return event % 3 == 0

    event = Events.ITERATION_COMPLETED(event_filter=every_third)
    assert event.filter is every_third
    assert [i for i in range(1, 8) if Events.ITERATION_COMPLETED(every=2).filter(None, i)] == [2, 4, 6]


def test_should_terminate_says_skip_completed_as_ignite():
    e = Engine(lambda e, b: e.terminate(skip_completed=True))
    e.run([1])
    assert e.should_terminate == "skip_completed"
    e = Engine(lambda e, b: e.terminate())
    e.run([1])
    assert e.should_terminate is True
    e.run([1, 2], max_epochs=2)
    assert e.should_terminate is True


def test_setting_should_terminate_from_a_handler_stops_the_run():
    """Older Ignite code sets the flag itself; the run stops after that event, as with terminate()."""
    e = Engine(lambda e, b: b)
    fired = []
    for event in (Events.TERMINATE, Events.COMPLETED):
        e.add_event_handler(event, lambda e, event=event: fired.append(event.name))
    e.add_event_handler(Events.ITERATION_COMPLETED(once=2), lambda e: setattr(e, "should_terminate", True))
    assert (e.run(range(5)).iteration, fired) == (2, ["TERMINATE", "COMPLETED"])


def test_should_terminate_single_epoch_as_ignite_sets_it():
    e = Engine(lambda e, b: b)
    flags = []
    e.add_event_handler(Events.ITERATION_COMPLETED(once=2), lambda e: e.terminate_epoch(skip_epoch_completed=True))
    e.add_event_handler(Events.ITERATION_COMPLETED(once=2), lambda e: flags.append(e.should_terminate_single_epoch))
    e.add_event_handler(Events.ITERATION_COMPLETED(once=5), lambda e: e.terminate_epoch())
    e.add_event_handler(Events.ITERATION_COMPLETED(once=5), lambda e: flags.append(e.should_terminate_single_epoch))
    e.add_event_handler(Events.EPOCH_STARTED, lambda e: flags.append(e.should_terminate_single_epoch))
    e.run(range(3), max_epochs=2)
    assert flags == [False, "skip_epoch_completed", False, True]
    assert e.should_terminate_single_epoch is False
    e = Engine(lambda e, b: b)  # set directly, as older Ignite code does
    e.add_event_handler(Events.ITERATION_COMPLETED(once=1), lambda e: setattr(e, "should_terminate_single_epoch", True))
    assert e.run(range(3), max_epochs=2).iteration == 4


def test_terminate_on_nan_skips_parts_of_the_output_that_are_not_numbers():
    """Ignite applies its check to numbers and tensors only: a string in the output is skipped."""
    losses = iter([1.0, float("nan"), 2.0, 3.0])
    t = Engine(lambda e, b: {"loss": jnp.float32(next(losses)), "name": "run-1", "n": 3})
    TerminateOnNan().attach(t)
    assert t.run(range(4)).iteration == 3


def test_bad_input_raises_ignites_exception_types():
    """A migrating user's ``except`` clauses: ValueError where Ignite raises it, TypeError where it does."""
    with pytest.raises(ValueError, match=r"`process_fn` must be callable"):
        Engine(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"cannot be called on Events.STARTED"):
        Engine(lambda e, b: b).add_event_handler(Events.STARTED, lambda a, b, c: None)
    with pytest.raises(ValueError, match=r"`event_filter` must accept two arguments \(engine, value\)"):
        Events.ITERATION_COMPLETED(event_filter=lambda a: True)

    class Custom(EventEnum):
        A = "a"

    with pytest.raises(ValueError, match=r"`event_to_attr` must be a mapping of event to state attribute name"):
        Engine(lambda e, b: b).register_events(*Custom, event_to_attr="a")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`limit_sec` must be a positive number of seconds, got str 'abc'"):
        TimeLimit(limit_sec="abc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"does not exist, and create_dir=False"):
        DiskSaver("/nonexistent/ember/folder", create_dir=False)


def test_state_takes_keyword_arguments():
    state = State(iteration=3, epoch=1, best_loss=0.25)
    assert (state.iteration, state.epoch, state.best_loss, state.max_epochs) == (3, 1, 0.25, None)


def test_has_registered_events():
    e = Engine(lambda e, b: b)

    class Custom(EventEnum):
        A = "a"

    assert (e.has_registered_events(Events.STARTED), e.has_registered_events(Custom.A)) == (True, False)
    e.register_events(*Custom)
    assert e.has_registered_events(Custom.A)
    assert e.has_registered_events(Events.ITERATION_COMPLETED(every=2))
    assert not e.has_registered_events([1])  # unhashable: not an event


def test_the_engines_logger_is_named_as_ignites_and_logs_its_run(caplog):
    e = Engine(lambda e, b: b)
    assert isinstance(e.logger, logging.Logger)
    assert e.logger.name == "ember.engine._engine.Engine"
    e.add_event_handler(Events.ITERATION_COMPLETED(once=3), lambda e: e.terminate())
    with caplog.at_level(logging.INFO, logger="ember.engine"):
        e.run([1, 2], max_epochs=3)
        e.run()
    messages = [r.getMessage() for r in caplog.records]
    time = r"\d\d:\d\d:\d\d\.\d\d\d"
    expected = [
        r"Engine run starting with max_epochs=3\.",
        rf"Epoch\[1\] Complete\. Time taken: {time}",
        r"Terminate signaled\. Engine will stop after current iteration is finished\.",
        rf"Engine run finished\. Time taken: {time}",
        r"Engine run resuming from iteration 3, epoch 2 until 3 epochs",
        rf"Epoch\[2\] Complete\. Time taken: {time}",
        rf"Epoch\[3\] Complete\. Time taken: {time}",
        rf"Engine run finished\. Time taken: {time}",
    ]
    assert len(messages) == len(expected), messages
    for message, pattern in zip(messages, expected, strict=True):
        assert re.fullmatch(pattern, message), (message, pattern)
    caplog.clear()
    failing = Engine(lambda e, b: 1 / 0)
    with caplog.at_level(logging.ERROR, logger="ember.engine"), pytest.raises(ZeroDivisionError):
        failing.run([1])
    assert [r.getMessage() for r in caplog.records] == ["Engine run is terminating due to exception: division by zero"]


def test_an_exception_through_nested_runs_is_logged_once_and_an_empty_message_by_its_type(caplog):
    """An evaluator's run inside the trainer's (Optuna's pruning, say) logs the exception once, not once per run.

    A KeyboardInterrupt, whose message is empty, is named by its type.
    """
    trainer, evaluator = Engine(lambda e, b: b), Engine(lambda e, b: 1 / 0)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: evaluator.run([1]))
    with caplog.at_level(logging.ERROR, logger="ember.engine"), pytest.raises(ZeroDivisionError):
        trainer.run([1])
    assert [r.getMessage() for r in caplog.records] == ["Engine run is terminating due to exception: division by zero"]
    caplog.clear()

    def interrupted(engine, batch):
        raise KeyboardInterrupt

    with caplog.at_level(logging.ERROR, logger="ember.engine"), pytest.raises(KeyboardInterrupt):
        Engine(interrupted).run([1])
    assert [r.getMessage() for r in caplog.records] == ["Engine run is terminating due to exception: KeyboardInterrupt"]


def test_a_handles_engine_is_a_weak_reference():
    e = Engine(lambda e, b: b)
    handle = e.add_event_handler(Events.STARTED, lambda: None)
    assert isinstance(handle.engine, weakref.ref)
    assert handle.engine() is e
    assert handle.event_name is Events.STARTED
    del e
    gc.collect()
    assert handle.engine() is None
    handle.remove()  # the engine is gone: nothing to do


def test_interrupt_resume_enabled_false_makes_interrupt_raise():
    assert Engine.interrupt_resume_enabled is True

    class Legacy(Engine):
        interrupt_resume_enabled = False

    e = Legacy(lambda e, b: b)
    e.add_event_handler(Events.ITERATION_COMPLETED(once=1), lambda e: e.interrupt())
    with pytest.raises(RuntimeError, match=r"interrupt\(\) is disabled: Engine.interrupt_resume_enabled is False"):
        e.run([1, 2])


def test_default_event_filter_is_ignites_deprecated_always_true_filter():
    e = Engine(lambda e, b: b)
    seen = []
    e.add_event_handler(Events.ITERATION_COMPLETED(event_filter=Events.default_event_filter), lambda: seen.append(1))
    with pytest.warns(UserWarning, match=r"^Events.default_event_filter is deprecated and will be removed"):
        e.run([1, 2])
    assert seen == [1, 1]
