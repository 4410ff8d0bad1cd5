import pytest

from ember import EventEnum, Events, EventsList, FilteredEvent


class Custom(EventEnum):
    SAVED = "saved"


def test_events_are_named_as_in_ignite():
    """The built-in events carry Ignite's names and values."""
    assert [e.name for e in Events] == [
        "STARTED",
        "EPOCH_STARTED",
        "GET_BATCH_STARTED",
        "GET_BATCH_COMPLETED",
        "DATALOADER_STOP_ITERATION",
        "ITERATION_STARTED",
        "ITERATION_COMPLETED",
        "EPOCH_COMPLETED",
        "EXCEPTION_RAISED",
        "TERMINATE",
        "TERMINATE_SINGLE_EPOCH",
        "INTERRUPT",
        "COMPLETED",
    ]
    assert Events.ITERATION_COMPLETED.value == "iteration_completed"


@pytest.mark.parametrize(
    ("event", "text"),
    [
        (Events.STARTED, "Events.STARTED"),
        (Events.ITERATION_COMPLETED(every=100), "Events.ITERATION_COMPLETED(every=100)"),
        (Events.EPOCH_STARTED(every=5, before=25, after=8), "Events.EPOCH_STARTED(every=5, before=25, after=8)"),
        (Events.EPOCH_STARTED(after=3), "Events.EPOCH_STARTED(after=3)"),
        (Events.COMPLETED(once=3), "Events.COMPLETED(once=3)"),
        (Events.COMPLETED(once=[1, 4]), "Events.COMPLETED(once=[1, 4])"),
        (Events.ITERATION_STARTED(every_secs=30), "Events.ITERATION_STARTED(every_secs=30.0)"),
        (Custom.SAVED(every=2), "Custom.SAVED(every=2)"),
        (Events.STARTED | Events.COMPLETED(once=1), "Events.STARTED | Events.COMPLETED(once=1)"),
    ],
)
def test_events_print_as_written(event, text):
    """Printing shows an event, a filtered event and a list as they are written in code."""
    assert repr(event) == text


def test_filtered_event_with_a_named_function_prints_its_name():
    """A custom filter prints by its qualified name."""

    def first_two(engine, value):
        return value <= 2

    assert repr(Events.STARTED(first_two)) == (
        "Events.STARTED(event_filter=test_filtered_event_with_a_named_function_prints_its_name.<locals>.first_two)"
    )


def test_filtered_event_equals_and_hashes_like_its_base_event():
    """Events.X(every=2) == Events.X and hashes alike; a different event or enum is not equal."""
    filtered = Events.ITERATION_COMPLETED(every=2)
    assert isinstance(filtered, FilteredEvent)
    assert filtered == Events.ITERATION_COMPLETED
    assert Events.ITERATION_COMPLETED == filtered  # noqa: SIM300  # the reflected comparison is what is tested
    assert filtered == Events.ITERATION_COMPLETED(once=3)
    assert hash(filtered) == hash(Events.ITERATION_COMPLETED)
    assert filtered != Events.ITERATION_STARTED
    assert filtered != "iteration_completed"
    assert filtered.name == "ITERATION_COMPLETED"
    assert {filtered: 1}[Events.ITERATION_COMPLETED] == 1


def test_events_list_is_built_with_or():
    """A | B | C builds an EventsList in order, with filters kept and duplicates allowed."""
    events = Events.STARTED | Events.ITERATION_COMPLETED(every=3) | Events.STARTED
    assert isinstance(events, EventsList)
    assert len(events) == 3
    assert events[0] is Events.STARTED
    assert repr(events[1]) == "Events.ITERATION_COMPLETED(every=3)"
    events |= Events.COMPLETED
    assert [e.name for e in events] == ["STARTED", "ITERATION_COMPLETED", "STARTED", "COMPLETED"]
    assert len(EventsList([Events.STARTED]) | (Events.COMPLETED | Events.INTERRUPT)) == 3


def test_events_list_refuses_non_events():
    """Or-ing an event with something that is not an event raises TypeError naming it."""
    with pytest.raises(TypeError, match=r"An EventsList holds events .* got int 3"):
        Events.STARTED | 3
