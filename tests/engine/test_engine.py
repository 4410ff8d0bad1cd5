import gc
import weakref
from collections.abc import Iterator

import pytest

from ember import Engine, EventEnum, Events
from tests.engine import expectations as expect
from tests.engine.recording import batches_seen, record, recording_engine


def test_two_epochs_fire_the_31_events_of_ignite_in_order():
    """run([10, 20, 30], max_epochs=2) fires exactly Ignite's 31 events."""
    engine, log = recording_engine()
    engine.run([10, 20, 30], max_epochs=2)
    assert log == expect.RUN_TWO_EPOCHS
    assert len(log) == 31


def test_counters_are_one_based_and_get_batch_events_see_the_previous_iteration():
    """Iteration events see the new iteration; GET_BATCH events still see the previous one."""
    engine = Engine(lambda e, b: b)
    seen: list[tuple[str, int, int]] = []
    for ev in (Events.EPOCH_STARTED, Events.GET_BATCH_STARTED, Events.GET_BATCH_COMPLETED, Events.ITERATION_STARTED):
        engine.add_event_handler(ev, lambda e, ev=ev: seen.append((ev.name, e.state.epoch, e.state.iteration)))
    engine.run([1, 2], max_epochs=1)
    assert seen == [
        ("EPOCH_STARTED", 1, 0),
        ("GET_BATCH_STARTED", 1, 0),
        ("GET_BATCH_COMPLETED", 1, 0),
        ("ITERATION_STARTED", 1, 1),
        ("GET_BATCH_STARTED", 1, 1),
        ("GET_BATCH_COMPLETED", 1, 1),
        ("ITERATION_STARTED", 1, 2),
    ]


def test_output_and_batch_are_set_at_iteration_completed():
    """state.output holds the process function's return value, state.batch the batch, untouched."""
    engine = Engine(lambda e, b: {"double": b * 2})
    seen = []
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append((e.state.batch, e.state.output)))
    state = engine.run([1, 2, 3])
    assert seen == [(1, {"double": 2}), (2, {"double": 4}), (3, {"double": 6})]
    assert (state.iteration, state.epoch, state.epoch_length, state.max_epochs) == (3, 1, 3, 1)


def test_data_none_needs_epoch_length_and_fires_no_get_batch_events():
    """Without data the process function gets None and no GET_BATCH events fire."""
    batches = []
    engine = Engine(lambda e, b: batches.append(b))
    log = record(engine)
    engine.run(epoch_length=2, max_epochs=1)
    assert log == expect.RUN_WITHOUT_DATA
    assert batches == [None, None]
    with pytest.raises(ValueError, match=r"`epoch_length` is required when `data` is None"):
        Engine(lambda e, b: None).run(max_epochs=2)


def test_max_iters_ends_with_terminate_then_completed_without_epoch_completed():
    """A max_iters run that stops mid-epoch fires TERMINATE then COMPLETED, no EPOCH_COMPLETED."""
    engine, log = recording_engine()
    state = engine.run([1, 2, 3], max_iters=4)
    assert log == expect.RUN_MAX_ITERS
    assert (state.iteration, state.epoch, state.max_epochs, state.max_iters) == (4, 2, None, 4)


def test_max_iters_on_an_epoch_boundary_completes_normally():
    """max_iters that ends an epoch exactly ends like max_epochs: EPOCH_COMPLETED, COMPLETED."""
    engine, log = recording_engine()
    engine.run([1, 2, 3], max_iters=6)
    assert log[-2:] == ["EPOCH_COMPLETED", "COMPLETED"]
    assert "TERMINATE" not in log


def test_epoch_length_shorter_than_data_carries_the_iterator_over():
    """With epoch_length < len(data) the next epoch continues the same iterator, as in Ignite."""
    engine = Engine(lambda e, b: b)
    seen = batches_seen(engine)
    engine.run([1, 2, 3, 4, 5], max_epochs=3, epoch_length=2)
    assert seen == [(1, 1, 1), (1, 2, 2), (2, 3, 3), (2, 4, 4), (3, 5, 5), (3, 6, 1)]


def test_generator_of_unknown_length_learns_epoch_length_at_the_end_of_epoch_one():
    """A re-iterable without __len__ sets epoch_length when its first pass ends."""

    class Stream:
        def __iter__(self) -> Iterator[int]:
            return iter(range(3))

    engine, log = recording_engine()
    lengths = []
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: lengths.append(e.state.epoch_length))
    state = engine.run(Stream(), max_epochs=2)
    assert lengths == [3, 3]
    assert state.iteration == 6
    # epoch 1 ends on the failed fetch, without DATALOADER_STOP_ITERATION; epoch 2 ends by count
    assert log[:16] == ["STARTED", "EPOCH_STARTED", *expect.ITER * 3, "GET_BATCH_STARTED", "EPOCH_COMPLETED"]
    assert log.count("DATALOADER_STOP_ITERATION") == 1


def test_max_iters_with_unknown_length_derives_max_epochs():
    """max_iters over data of unknown length sets max_epochs once the length is known."""
    engine = Engine(lambda e, b: b)
    state = engine.run((x for x in range(4)), max_iters=3)
    assert (state.iteration, state.epoch_length, state.max_epochs) == (3, None, None)
    state = Engine(lambda e, b: b).run(iter([1, 2]), max_iters=2)
    assert (state.iteration, state.epoch_length, state.max_epochs) == (2, None, None)


def test_exhausted_iterator_warns_and_stops_the_run():
    """A one-shot generator asked for more epochs warns once, completes the epoch and the run."""
    engine, log = recording_engine()
    with pytest.warns(UserWarning, match=r"The data ran out at iteration 3 of 9, in epoch 2; the run stops here"):
        state = engine.run((x for x in range(3)), max_epochs=3)
    assert state.iteration == 3
    assert state.epoch == 2
    assert log[-6:] == [
        "EPOCH_COMPLETED",
        "EPOCH_STARTED",
        "GET_BATCH_STARTED",
        "DATALOADER_STOP_ITERATION",
        "EPOCH_COMPLETED",
        "COMPLETED",
    ]


def test_empty_generator_is_an_error():
    """A generator that yields nothing cannot define an epoch."""
    with pytest.raises(ValueError, match=r"`data` produced no batches"):
        Engine(lambda e, b: b).run(iter([]))


def test_set_data_switches_source_from_the_next_batch():
    """set_data makes the next batch come from the start of the new data."""
    engine = Engine(lambda e, b: b)
    seen = batches_seen(engine)
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=2), lambda e: e.set_data([100, 200, 300, 400]))
    engine.run([1, 2, 3], max_epochs=2)
    assert [b for _, _, b in seen] == [1, 2, 100, 200, 300, 400]
    assert engine.state.epoch_length == 3
    with pytest.raises(TypeError, match=r"`data` must be an iterable of batches, got int"):
        engine.set_data(5)  # type: ignore[arg-type]


def test_exception_fires_exception_raised_once_then_propagates():
    """EXCEPTION_RAISED fires once per exception with (engine, exc); the exception leaves run()."""

    def process(engine, batch):
        if engine.state.iteration == 2:
            raise KeyError("bad batch")

    engine = Engine(process)
    log = record(engine, [e for e in Events if e is not Events.EXCEPTION_RAISED])
    caught = []
    engine.add_event_handler(Events.EXCEPTION_RAISED, lambda e, exc: caught.append(("first", exc)))
    engine.add_event_handler(Events.EXCEPTION_RAISED, lambda e, exc: caught.append(("second", exc)))
    with pytest.raises(KeyError, match="bad batch"):
        engine.run([1, 2, 3], max_epochs=2)
    assert [tag for tag, _ in caught] == ["first", "second"]
    assert caught[0][1] is caught[1][1]
    assert log[-1] == "ITERATION_STARTED"
    assert "EPOCH_COMPLETED" not in log
    assert "COMPLETED" not in log


def test_a_reraising_exception_handler_is_called_once():
    """A handler that re-raises is not called a second time (Ignite #1234)."""
    calls = []

    def reraise(engine, exc):
        calls.append(exc)
        raise RuntimeError("wrapped") from exc

    engine = Engine(lambda e, b: 1 / 0)
    engine.add_event_handler(Events.EXCEPTION_RAISED, reraise)
    with pytest.raises(RuntimeError, match="wrapped"):
        engine.run([1, 2])
    assert len(calls) == 1
    assert isinstance(calls[0], ZeroDivisionError)


def test_exception_in_a_handler_propagates_through_exception_raised():
    """An error inside a handler fires EXCEPTION_RAISED and leaves run()."""
    engine = Engine(lambda e, b: b)
    caught = []
    engine.add_event_handler(Events.EXCEPTION_RAISED, lambda e, exc: caught.append(type(exc)))
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: [][1])
    with pytest.raises(IndexError):
        engine.run([1])
    assert caught == [IndexError]


def test_run_after_an_exception_continues_with_the_next_batch():
    """After an exception the next run() picks up at the batch after the failed one."""
    fail = {"at": 2}

    def process(engine, batch):
        if engine.state.iteration == fail["at"]:
            fail["at"] = None
            raise ValueError("flaky")
        return batch

    engine = Engine(process)
    seen = batches_seen(engine)
    with pytest.raises(ValueError, match="flaky"):
        engine.run([1, 2, 3], max_epochs=2)
    engine.run([1, 2, 3])
    assert [(i, b) for _, i, b in seen] == [(1, 1), (3, 3), (4, 1), (5, 2), (6, 3)]


def test_run_from_inside_its_own_run_is_refused():
    """Calling run() on the running engine from a handler raises a RuntimeError naming the fix."""
    engine = Engine(lambda e, b: b)
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: e.run([1]))
    with pytest.raises(RuntimeError, match=r"run\(\) was called while this engine is running"):
        engine.run([1, 2])


def test_an_evaluator_can_run_inside_a_trainer_handler():
    """A second engine runs to completion inside the first engine's handler, each time from zero."""
    evaluator = Engine(lambda e, b: b)
    trainer = Engine(lambda e, b: b)
    results = []

    @trainer.on(Events.EPOCH_COMPLETED)
    def validate(engine):
        results.append(evaluator.run([5, 6]).iteration)

    trainer.run([1, 2], max_epochs=3)
    assert results == [2, 2, 2]


def test_bad_run_arguments_fail_with_clear_errors():
    """Each invalid run() argument raises naming the argument, the rule and the value."""
    engine = Engine(lambda e, b: b)
    with pytest.raises(TypeError, match=r"`data` must be an iterable of batches .* got int"):
        engine.run(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`data` is empty; pass at least one batch"):
        engine.run([])
    with pytest.raises(ValueError, match=r"`max_epochs` and `max_iters` are mutually exclusive; got max_epochs=2"):
        engine.run([1], max_epochs=2, max_iters=3)
    with pytest.raises(ValueError, match=r"`max_epochs` must be a positive int, got 0"):
        engine.run([1], max_epochs=0)
    with pytest.raises(TypeError, match=r"`epoch_length` must be a positive int or None, got float 2.5"):
        engine.run([1], epoch_length=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`max_iters` must be a positive int or None, got bool True"):
        engine.run([1], max_iters=True)
    assert engine.state.iteration == 0


def test_process_fn_is_checked_at_construction():
    """Engine(None) and a function that cannot take (engine, batch) raise ValueError (Ignite's); 3, TypeError."""
    with pytest.raises(ValueError, match=r"`process_fn` must be callable as process_fn\(engine, batch\), got None"):
        Engine(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`process_fn` must be callable as process_fn\(engine, batch\), got 3"):
        Engine(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`process_fn` must accept \(engine, batch\); .*\(batch\) does not"):
        Engine(lambda batch: batch)  # type: ignore[arg-type]


def test_custom_events_fire_with_their_own_counter():
    """Custom events fire from the process function; event_to_attr gives filters a counter."""

    class Backprop(EventEnum):
        STEP_DONE = "step_done"

    def process(engine, batch):
        for _ in range(2):
            engine.state.steps += 1
            engine.fire_event(Backprop.STEP_DONE)

    engine = Engine(process)
    engine.register_events(*Backprop, event_to_attr={Backprop.STEP_DONE: "steps"})
    fired = []
    engine.add_event_handler(Backprop.STEP_DONE(every=3), lambda e: fired.append(e.state.steps))
    engine.run([1, 2, 3, 4])
    assert fired == [3, 6]
    assert engine.state.steps == 8


def test_event_to_attr_belongs_to_one_engine():
    """Mapping a counter on one engine does not touch another engine (Ignite keeps it on the class)."""

    class Custom(EventEnum):
        TICK = "tick"

    a, b = Engine(lambda e, x: x), Engine(lambda e, x: x)
    a.register_events(*Custom, event_to_attr={Custom.TICK: "ticks"})
    b.register_events(*Custom)
    assert a.state.ticks == 0  # type: ignore[attr-defined]
    assert not hasattr(b.state, "ticks")
    with pytest.raises(ValueError, match=r"Custom.TICK\(every=2\) has a filter but Custom.TICK has no counter"):
        b.add_event_handler(Custom.TICK(every=2), print)


def test_string_events_and_registration_errors():
    """Strings register as events; unregistered events and bad registrations fail clearly."""
    engine = Engine(lambda e, x: x)
    engine.register_events("saved")
    got = []
    engine.add_event_handler("saved", lambda: got.append("saved"))
    engine.fire_event("saved")
    assert got == ["saved"]
    assert engine.last_event_name == "saved"
    with pytest.raises(ValueError, match=r"'other' is not an event of this engine; register it"):
        engine.fire_event("other")
    with pytest.raises(TypeError, match=r"fire_event takes the base event, not a filtered one: use Events.STARTED"):
        engine.fire_event(Events.STARTED(once=1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"register_events takes EventEnum members or strings, got int 3"):
        engine.register_events(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`event_to_attr` maps 'x', which is not registered"):
        engine.register_events("y", event_to_attr={"x": "xs"})


def test_state_times_are_measured():
    """state.times holds the last epoch's and the run's durations in seconds."""
    state = Engine(lambda e, b: b).run([1, 2], max_epochs=2)
    epoch, run = state.times["EPOCH_COMPLETED"], state.times["COMPLETED"]
    assert epoch is not None
    assert run is not None
    assert 0 <= epoch <= run


def test_a_finished_engine_is_garbage_collected():
    """Nothing (handles, handlers, the run generator) keeps a finished engine alive."""
    engine = Engine(lambda e, b: b)
    handle = engine.add_event_handler(Events.ITERATION_COMPLETED(every=2), lambda e: None)
    engine.add_event_handler(Events.COMPLETED, lambda e: None)
    engine.run([1, 2, 3], max_epochs=2)
    ref = weakref.ref(engine)
    del engine
    gc.collect()
    assert ref() is None
    handle.remove()  # a handle outliving its engine is harmless


def test_a_k_step_trainer_counts_before_each_iteration_event_too():
    """steps_per_call=3 over 7 batches: each ITERATION event sees its own 1-based iteration, in order."""
    import jax.numpy as jnp
    import optax

    from ember.training import TrainState, create_trainer

    state = TrainState.create(lambda p, x: x * p, jnp.array(1.0), optax.sgd(0.1))
    trainer = create_trainer(state, lambda m, b: jnp.mean(m(b) ** 2), steps_per_call=3)
    seen = []
    for ev in (Events.ITERATION_STARTED, Events.ITERATION_COMPLETED):
        trainer.add_event_handler(ev, lambda e, ev=ev: seen.append((ev.name[10:], e.state.iteration)))
    trainer.run([jnp.ones(2)] * 7)
    assert seen == [(kind, i) for i in range(1, 8) for kind in ("STARTED", "COMPLETED")]


def test_nested_collect_handles_the_outer_handle_undoes_what_the_inner_block_registered():
    """An attach inside an attach: the outer handle removes the inner's handlers and calls the inner's undo."""
    from ember import collect_handles

    engine = Engine(lambda e, b: b)
    undone = []

    def inner():
        pass

    def outer():
        pass

    with collect_handles() as made_outer:
        engine.add_event_handler(Events.STARTED, outer)
        with collect_handles() as made_inner:
            engine.add_event_handler(Events.COMPLETED, inner)
            made_inner.on_remove(lambda: undone.append("inner"))
        made_outer.on_remove(lambda: undone.append("outer"))
    assert [h.handler() for h in made_inner.handles] == [inner]
    made_outer.handle.remove()
    assert (engine.has_event_handler(outer), engine.has_event_handler(inner)) == (False, False)
    assert undone == ["inner", "outer"]
    made_inner.handle.remove()  # already undone by the outer: nothing more
    assert undone == ["inner", "outer"]
