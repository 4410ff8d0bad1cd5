import pytest
from hypothesis import given
from hypothesis import strategies as st

from ember import Engine, Events
from ember.engine._filters import NEVER


def fired_at(event, values=range(1, 31)):
    """The values among ``values`` at which a fresh registration of ``event`` fires, in a real run."""
    engine = Engine(lambda e, b: None)
    fired = []
    engine.add_event_handler(event, lambda e: fired.append(e.state.epoch))
    engine.run([0], max_epochs=max(values))
    return [v for v in fired if v in values]


def test_every_fires_on_multiples():
    """every=n fires at n, 2n, 3n ..."""
    assert fired_at(Events.EPOCH_COMPLETED(every=7)) == [7, 14, 21, 28]


def test_every_with_bounds_counts_from_after_plus_one():
    """EPOCH_STARTED(every=5, before=25, after=8) over 30 epochs fires at 9, 14, 19, 24."""
    assert fired_at(Events.EPOCH_STARTED(every=5, before=25, after=8)) == [9, 14, 19, 24]


def test_before_and_after_alone_are_exclusive_bounds():
    """before= and after= on their own select the values strictly inside the bounds."""
    assert fired_at(Events.EPOCH_STARTED(before=4)) == [1, 2, 3]
    assert fired_at(Events.EPOCH_STARTED(after=27)) == [28, 29, 30]
    assert fired_at(Events.EPOCH_STARTED(after=2, before=6)) == [3, 4, 5]


def test_once_fires_at_one_value_or_each_of_a_list():
    """once=n fires at n; once=[...] fires once at each listed value."""
    assert fired_at(Events.EPOCH_COMPLETED(once=3)) == [3]
    assert fired_at(Events.EPOCH_COMPLETED(once=[2, 5, 23])) == [2, 5, 23]


def test_custom_filter_receives_engine_and_value():
    """event_filter(engine, value) decides each firing."""
    calls = []

    def odd(engine, value):
        calls.append(type(engine).__name__)
        return value % 2 == 1

    assert fired_at(Events.EPOCH_COMPLETED(event_filter=odd), range(1, 6)) == [1, 3, 5]
    assert set(calls) == {"Engine"}


@pytest.mark.parametrize(
    ("tick", "expected"),
    [
        # readings 0.4, 0.8, ... at iterations 1, 2, ...; the first reading starts the count
        (0.4, [4, 7, 10]),
        # readings 0.5 s apart (exact in binary): 1.5 - 0.5 == 1.0 reaches the interval exactly, and fires
        (0.5, [3, 5, 7, 9]),
    ],
)
def test_every_secs_fires_once_the_injected_clock_advanced_at_least_that_much(tick, expected):
    """every_secs fires when the clock advanced by at least that many seconds since the last firing (``>=``)."""
    now = [0.0]
    engine = Engine(lambda e, b: now.__setitem__(0, now[0] + tick))
    fired = []
    engine.add_event_handler(
        Events.ITERATION_COMPLETED(every_secs=1.0, clock=lambda: now[0]), lambda e: fired.append(e.state.iteration)
    )
    engine.run(range(10))
    assert fired == expected


def test_once_does_not_refire_when_a_value_repeats_after_terminate_epoch():
    """GET_BATCH_STARTED(once=2) fires once even though terminate_epoch makes value 2 repeat (Ignite #3625)."""
    engine = Engine(lambda e, b: b)
    fired, values = [], []
    engine.add_event_handler(Events.GET_BATCH_STARTED, lambda e: values.append(e.state.iteration))

    @engine.on(Events.GET_BATCH_STARTED(once=2))
    def stop_epoch(e):
        fired.append(e.state.epoch)
        e.terminate_epoch()

    engine.run([1, 2, 3], max_epochs=2)
    assert values.count(2) == 2
    assert fired == [1]


def test_every_refires_when_a_value_repeats():
    """Pure filters (every) see a repeated value again and fire again, as in Ignite."""
    engine = Engine(lambda e, b: b)
    fired = []
    engine.add_event_handler(Events.GET_BATCH_STARTED(once=2), lambda e: e.terminate_epoch())
    engine.add_event_handler(Events.GET_BATCH_STARTED(every=2), lambda e: fired.append(e.state.iteration))
    engine.run([1, 2, 3], max_epochs=2)
    assert fired == [2, 2, 4]


def test_once_fires_again_in_a_new_run():
    """A fresh run (from iteration 0) fires once-filters again: the evaluator pattern."""
    evaluator = Engine(lambda e, b: b)
    fired = []
    evaluator.add_event_handler(Events.ITERATION_COMPLETED(once=1), lambda e: fired.append(e.state.batch))
    evaluator.run([1, 2])
    evaluator.run([3, 4])
    assert fired == [1, 3]


def test_one_filtered_event_registered_twice_keeps_separate_once_state():
    """Two registrations of the same once-event each fire once."""
    engine = Engine(lambda e, b: b)
    event = Events.ITERATION_COMPLETED(once=2)
    fired = []
    engine.add_event_handler(event, lambda e: fired.append("a"))
    engine.add_event_handler(event, lambda e: fired.append("b"))
    engine.run([1, 2, 3])
    assert fired == ["a", "b"]


def test_filters_on_started_and_completed_see_the_epoch():
    """STARTED and COMPLETED filter on the epoch counter."""
    engine = Engine(lambda e, b: b)
    fired = []
    engine.add_event_handler(Events.COMPLETED(once=3), lambda e: fired.append("completed"))
    engine.add_event_handler(Events.STARTED(event_filter=lambda e, v: v == 0), lambda e: fired.append("started"))
    engine.run([1], max_epochs=3)
    assert fired == ["started", "completed"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, r"takes exactly one of .* got none"),
        ({"every": 2, "once": 3}, ValueError, r"got every/before/after and once"),
        ({"event_filter": lambda e, v: True, "every": 2}, ValueError, r"got event_filter and every/before/after"),
        ({"once": 2, "every_secs": 1.0}, ValueError, r"got once and every_secs"),
        ({"every": 0}, ValueError, r"`every` must be a positive int, got 0"),
        ({"every": 2.0}, ValueError, r"`every` must be a positive int, got 2.0"),
        ({"once": 0}, ValueError, r"`once` must be a positive int, got 0"),
        ({"once": []}, ValueError, r"non-empty list of positive ints, got \[\]"),
        ({"once": [1, -2]}, ValueError, r"`once` must be a positive int, got -2"),
        ({"once": "3"}, ValueError, r"`once` must be a positive int or a non-empty list of positive ints, got '3'"),
        ({"before": -1}, ValueError, r"`before` must be a non-negative int, got -1"),
        ({"after": 5, "before": 6}, ValueError, r"before=6, after=5 leave no value to fire on"),
        ({"every_secs": 0}, ValueError, r"`every_secs` must be a positive number of seconds, got 0"),
        ({"every": 2, "clock": lambda: 0.0}, ValueError, r"`clock` only applies to `every_secs`"),
        ({"event_filter": 3}, TypeError, r"`event_filter` must be callable as event_filter\(engine, value\), got 3"),
        (
            {"event_filter": lambda v: True},
            ValueError,
            r"must accept two arguments \(engine, value\); .*\(v\) does not",
        ),
    ],
)
def test_bad_filter_arguments_raise_at_construction(kwargs, error, match):
    """Invalid filter arguments raise when the filtered event is built, naming the argument."""
    with pytest.raises(error, match=match):
        Events.ITERATION_COMPLETED(**kwargs)


@given(
    every=st.integers(1, 12),
    after=st.one_of(st.none(), st.integers(0, 40)),
    span=st.one_of(st.none(), st.integers(2, 40)),
    value=st.integers(0, 80),
)
def test_next_due_is_the_next_value_that_fires(every, after, span, value):
    """For every/before/after, next_due(v) is exactly the smallest w > v at which the filter fires."""
    before = None if span is None else (after or 0) + span
    f = Events.ITERATION_COMPLETED(every=every, after=after, before=before).filter
    brute = next((w for w in range(value + 1, 200) if f(None, w)), NEVER)
    assert f.next_due(value) == brute


@given(values=st.lists(st.integers(1, 50), min_size=1, max_size=6), value=st.integers(0, 60))
def test_once_next_due_is_the_next_listed_value(values, value):
    """For once=[...], next_due(v) is the smallest listed value above v."""
    f = Events.ITERATION_COMPLETED(once=values).filter
    assert f.next_due(value) == min((v for v in values if v > value), default=NEVER)


def test_once_fires_again_after_each_new_run_but_not_in_a_resumed_one():
    """once=[2, 5]: fires at both in each new run; a run resumed at iteration 3 fires only at 5."""
    fired = []

    def engine():
        e = Engine(lambda e, b: b)
        e.add_event_handler(Events.ITERATION_COMPLETED(once=[2, 5]), lambda e: fired.append(e.state.iteration))
        return e

    first = engine()
    first.run([0, 1, 2], max_epochs=2)
    first.run([0, 1, 2], max_epochs=2)  # a finished run started again: a new run from iteration 0
    assert fired == [2, 5, 2, 5]
    stopped = engine()
    stopped.add_event_handler(
        Events.ITERATION_COMPLETED(once=3), lambda e: e.terminate(final=False)
    )  # stopped, not ended
    stopped.run([0, 1, 2], max_epochs=2)
    resumed = engine()
    resumed.load_state_dict(stopped.state_dict())
    fired.clear()
    resumed.run([0, 1, 2])
    assert fired == [5]
