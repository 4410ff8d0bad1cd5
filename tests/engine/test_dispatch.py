import gc
import weakref

import pytest

from ember import Engine, Events, RemovableEventHandle
from tests.engine.recording import recording_engine


def test_handlers_run_in_registration_order_with_their_arguments():
    """Handlers of one event run in the order registered, with extra args and kwargs."""
    engine = Engine(lambda e, b: b)
    calls = []
    engine.add_event_handler(
        Events.STARTED, lambda e, tag, sep="": calls.append(f"{tag}{sep}{e.state.epoch}"), "a", sep=":"
    )
    engine.add_event_handler(Events.STARTED, lambda tag: calls.append(tag), "b")
    engine.add_event_handler(Events.STARTED, lambda: calls.append("c"))
    engine.run([1])
    assert calls == ["a:0", "b", "c"]


def test_handler_signature_is_checked_at_registration():
    """A handler that can take neither (engine, *args) nor (*args) is refused, naming both forms."""
    engine = Engine(lambda e, b: b)

    def two(engine, x):
        pass

    with pytest.raises(
        ValueError,
        match=r"Handler `.*two\(engine, x\)` cannot be called on Events.STARTED: it will receive \(engine\) or \(\)",
    ):
        engine.add_event_handler(Events.STARTED, two)
    with pytest.raises(ValueError, match=r"it will receive \(engine, 1, 2, 3\) or \(1, 2, 3\)"):
        engine.add_event_handler(Events.STARTED, two, 1, 2, 3)
    with pytest.raises(TypeError, match=r"`handler` must be callable, got int 5"):
        engine.add_event_handler(Events.STARTED, 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"it will receive \(engine, <exception>\) or \(<exception>\)"):
        engine.add_event_handler(Events.EXCEPTION_RAISED, lambda: None)
    assert not engine.has_event_handler(two)


def test_events_list_registers_once_per_element_and_fires_duplicates_twice():
    """A | B registers the handler on each; a repeated event calls it twice per firing."""
    engine = Engine(lambda e, b: b)
    calls = []
    handle = engine.on(Events.STARTED | Events.COMPLETED | Events.COMPLETED)(lambda e: calls.append(e.last_event_name))
    engine.run([1])
    assert calls == [Events.STARTED, Events.COMPLETED, Events.COMPLETED]
    assert handle is not None


def test_has_and_remove_treat_a_filtered_event_as_its_base():
    """has_event_handler/remove_event_handler find a handler whatever filter it was registered with."""
    engine = Engine(lambda e, b: b)

    def h(engine):
        pass

    engine.add_event_handler(Events.ITERATION_COMPLETED(every=3), h)
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=1), h)
    assert engine.has_event_handler(h)
    assert engine.has_event_handler(h, Events.ITERATION_COMPLETED)
    assert engine.has_event_handler(h, Events.ITERATION_COMPLETED(every=7))
    assert not engine.has_event_handler(h, Events.ITERATION_STARTED)
    engine.remove_event_handler(h, Events.ITERATION_COMPLETED(once=99))
    assert not engine.has_event_handler(h)
    with pytest.raises(ValueError, match=r"Handler .* is not registered on Events.ITERATION_COMPLETED"):
        engine.remove_event_handler(h, Events.ITERATION_COMPLETED)
    with pytest.raises(ValueError, match=r"'nope' is not an event of this engine"):
        engine.remove_event_handler(h, "nope")
    assert not engine.has_event_handler(h, "nope")


def test_handle_removes_exactly_its_registration_and_is_idempotent():
    """handle.remove() takes away its own registration only; calling it twice is harmless."""
    engine = Engine(lambda e, b: b)
    calls = []

    def h(engine, tag):
        calls.append(tag)

    first = engine.add_event_handler(Events.ITERATION_COMPLETED, h, "first")
    engine.add_event_handler(Events.ITERATION_COMPLETED, h, "second")
    first.remove()
    first.remove()
    engine.run([1])
    assert calls == ["second"]
    assert isinstance(first, RemovableEventHandle)
    assert repr(first).startswith("RemovableEventHandle(event=Events.ITERATION_COMPLETED, handler=<function")


def test_handle_is_a_context_manager():
    """Leaving a `with handle:` block removes the handler, for every event of an EventsList."""
    engine = Engine(lambda e, b: b)
    calls = []

    def h(engine):
        calls.append(engine.last_event_name)

    with engine.add_event_handler(Events.STARTED | Events.COMPLETED, h):
        engine.run([1])
    engine.run([1])
    assert calls == [Events.STARTED, Events.COMPLETED]
    assert not engine.has_event_handler(h)


def test_handle_holds_weak_references():
    """A handle keeps neither the engine nor a bound-method handler's object alive."""

    class Logger:
        def log(self, engine):
            pass

    engine = Engine(lambda e, b: b)
    logger = Logger()
    handle = engine.add_event_handler(Events.STARTED, logger.log)
    assert handle.handler() == logger.log
    engine_ref = weakref.ref(engine)
    del engine
    gc.collect()
    assert engine_ref() is None
    del logger
    gc.collect()
    assert handle.handler() is None
    handle.remove()


def test_handler_added_during_an_event_runs_from_the_next_firing():
    """A handler registered by another handler of the same event first runs at the event's next firing."""
    engine = Engine(lambda e, b: b)
    calls = []

    def late(engine):
        calls.append(("late", engine.state.iteration))

    @engine.on(Events.ITERATION_COMPLETED(once=2))
    def add_late(engine):
        engine.add_event_handler(Events.ITERATION_COMPLETED(every=2), late)

    engine.run(range(6))
    assert calls == [("late", 4), ("late", 6)]


def test_handler_removed_by_an_earlier_handler_of_the_same_event_does_not_run():
    """Removing a later handler during dispatch takes effect at once."""
    engine = Engine(lambda e, b: b)
    calls = []

    def victim(engine):
        calls.append(engine.state.iteration)

    engine.add_event_handler(
        Events.ITERATION_COMPLETED(once=2), lambda e: e.remove_event_handler(victim, Events.ITERATION_COMPLETED)
    )
    engine.add_event_handler(Events.ITERATION_COMPLETED, victim)
    engine.run(range(4))
    assert calls == [1]


def test_filtered_handlers_fire_exactly_where_their_filters_say_when_mixed():
    """Unfiltered, every, once and custom filters on one event fire on their own values."""
    engine, _ = recording_engine()
    fired: dict[str, list[int]] = {"plain": [], "every": [], "once": [], "custom": []}
    engine.add_event_handler(Events.ITERATION_COMPLETED(every=4), lambda e: fired["every"].append(e.state.iteration))
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: fired["plain"].append(e.state.iteration))
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=[3, 9]), lambda e: fired["once"].append(e.state.iteration))
    engine.add_event_handler(
        Events.ITERATION_COMPLETED(lambda e, v: v in (5, 6)), lambda e: fired["custom"].append(e.state.iteration)
    )
    engine.run(range(5), max_epochs=2)
    assert fired == {"plain": list(range(1, 11)), "every": [4, 8], "once": [3, 9], "custom": [5, 6]}


def test_on_returns_the_function_unchanged():
    """@engine.on(...) registers and gives back the decorated function itself."""
    engine = Engine(lambda e, b: b)

    def f(engine):
        pass

    assert engine.on(Events.STARTED)(f) is f
    assert engine.has_event_handler(f, Events.STARTED)
