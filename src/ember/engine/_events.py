"""Events: the built-in `Events`, `EventEnum` for custom events, filtered events and `EventsList`."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from enum import Enum
from typing import Any

from ember.engine._filters import Custom, EventFilter, FilterFn, make_filter


class EventEnum(Enum):
    """Base class of event enums: subclass it to declare custom events.

    Members are callable: ``MyEvents.X(every=2)`` builds a [`FilteredEvent`][ember.engine.FilteredEvent], exactly like
    the built-in events. ``A | B`` builds an [`EventsList`][ember.engine.EventsList]. A member prints as it is written
    in code.

    Examples:
        >>> from ember import Engine, EventEnum
        >>> class BackpropEvents(EventEnum):
        ...     BACKWARD_COMPLETED = "backward_completed"
        >>> engine = Engine(lambda engine, batch: engine.fire_event(BackpropEvents.BACKWARD_COMPLETED))
        >>> engine.register_events(*BackpropEvents)
        >>> calls = []
        >>> _ = engine.add_event_handler(BackpropEvents.BACKWARD_COMPLETED, lambda: calls.append(1))
        >>> _ = engine.run([0, 1, 2])
        >>> len(calls)
        3
        >>> BackpropEvents.BACKWARD_COMPLETED
        BackpropEvents.BACKWARD_COMPLETED
    """

    def __call__(
        self,
        event_filter: FilterFn | None = None,
        *,
        every: int | None = None,
        once: int | Iterable[int] | None = None,
        before: int | None = None,
        after: int | None = None,
        every_secs: float | None = None,
        clock: Callable[[], float] | None = None,
    ) -> FilteredEvent:
        """This event, firing only where a filter says so.

        Args:
            event_filter: ``event_filter(engine, value) -> bool`` on the event's counter value.
            every: fire at every ``every``-th value (``every, 2 * every, ...``, or from ``after + 1``).
            once: fire once at this value, or once at each value of a list.
            before: fire only at values strictly below ``before``.
            after: fire only at values strictly above ``after``.
            every_secs: fire when at least this many seconds passed since the handler last fired.
            clock: the clock ``every_secs`` reads (default `time.monotonic`); for tests.

        Returns:
            A [`FilteredEvent`][ember.engine.FilteredEvent] that compares equal to this event.

        Raises:
            ValueError: no filter, two kinds at once, a value out of range, or an ``event_filter`` that cannot
                take ``(engine, value)`` (Ignite's type).
            TypeError: ``event_filter`` is not callable.
        """
        filt = make_filter(
            event_filter,
            every=every,
            once=once,
            before=before,
            after=after,
            every_secs=every_secs,
            clock=clock,
        )
        return FilteredEvent(self, filt)

    def __or__(self, other: Any) -> EventsList:
        return EventsList([self]) | other

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    __str__ = __repr__


class Events(EventEnum):
    """The events an [`Engine`][ember.engine.Engine] fires, named as in PyTorch Ignite.

    One run of two epochs over three batches fires, in order: ``STARTED``; ``EPOCH_STARTED``; three
    times ``GET_BATCH_STARTED``, ``GET_BATCH_COMPLETED``, ``ITERATION_STARTED``,
    ``ITERATION_COMPLETED``; ``EPOCH_COMPLETED``; the same for epoch 2 (whose first fetch also finds
    the data exhausted and fires ``DATALOADER_STOP_ITERATION``); ``COMPLETED``. ``TERMINATE``,
    ``TERMINATE_SINGLE_EPOCH``, ``INTERRUPT`` and ``EXCEPTION_RAISED`` fire on the paths their names
    say. See ``docs/concepts/events.md`` for the full order and the termination table.

    Examples:
        >>> from ember import Engine, Events
        >>> engine = Engine(lambda engine, batch: batch * 2)
        >>> @engine.on(Events.ITERATION_COMPLETED(every=2))
        ... def show(engine):
        ...     print(engine.state.iteration, engine.state.output)
        >>> _ = engine.run([1, 2, 3, 4])
        2 4
        4 8
        >>> Events.ITERATION_COMPLETED(every=100)
        Events.ITERATION_COMPLETED(every=100)
    """

    STARTED = "started"
    EPOCH_STARTED = "epoch_started"
    GET_BATCH_STARTED = "get_batch_started"
    GET_BATCH_COMPLETED = "get_batch_completed"
    DATALOADER_STOP_ITERATION = "dataloader_stop_iteration"
    ITERATION_STARTED = "iteration_started"
    ITERATION_COMPLETED = "iteration_completed"
    EPOCH_COMPLETED = "epoch_completed"
    EXCEPTION_RAISED = "exception_raised"
    TERMINATE = "terminate"
    TERMINATE_SINGLE_EPOCH = "terminate_single_epoch"
    INTERRUPT = "interrupt"
    COMPLETED = "completed"

    @staticmethod
    def default_event_filter(engine: Any, event: int) -> bool:
        """A filter that always fires; deprecated in Ignite, which warns on each call (so does this). Use ``None``.

        Examples:
            >>> import warnings
            >>> from ember import Events
            >>> with warnings.catch_warnings(record=True) as caught:
            ...     warnings.simplefilter("always")
            ...     Events.default_event_filter(None, 3), str(caught[0].message)
            (True, 'Events.default_event_filter is deprecated and will be removed. Please, use None instead')
        """
        warnings.warn(
            "Events.default_event_filter is deprecated and will be removed. Please, use None instead",
            UserWarning,
            stacklevel=2,
        )
        return True


class FilteredEvent:
    """An event with a filter, built by calling an event: ``Events.ITERATION_COMPLETED(every=25)``.

    It compares equal to (and hashes like) its base event, so ``has_event_handler`` and
    ``remove_event_handler`` find handlers whichever filter they were registered with. It prints as
    written.

    Attributes:
        event: the base event.
        filter: the filter, a callable ``(engine, value) -> bool``: the ``event_filter`` function given, as
            Ignite keeps it, or the filter built from ``every``/``once``/``before``/``after``/``every_secs``.
        rule: the filter as the engine runs it (an `EventFilter`: it also says when it is next due).

    Examples:
        >>> from ember import Events
        >>> event = Events.EPOCH_STARTED(every=5, before=25, after=8)
        >>> event
        Events.EPOCH_STARTED(every=5, before=25, after=8)
        >>> [epoch for epoch in range(1, 31) if event.filter(None, epoch)]
        [9, 14, 19, 24]
        >>> event == Events.EPOCH_STARTED
        True
    """

    __slots__ = ("event", "rule")

    def __init__(self, event: EventEnum, rule: EventFilter) -> None:
        self.event = event
        self.rule = rule

    @property
    def filter(self) -> Callable[[Any, int], bool]:
        """The filter: the ``event_filter`` function as given, else the filter built from the keywords."""
        return self.rule.fn if isinstance(self.rule, Custom) else self.rule

    @property
    def name(self) -> str:
        """The base event's name."""
        return self.event.name

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FilteredEvent):
            return self.event is other.event
        if isinstance(other, EventEnum):
            return self.event is other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.event)

    def __or__(self, other: Any) -> EventsList:
        return EventsList([self]) | other

    def __repr__(self) -> str:
        return f"{self.event!r}({self.rule.describe()})"


class EventsList:
    """Several events, built with ``|``; a handler registered on it is registered once per element.

    Examples:
        >>> from ember import Engine, Events
        >>> events = Events.STARTED | Events.EPOCH_COMPLETED(every=2) | Events.COMPLETED
        >>> events
        Events.STARTED | Events.EPOCH_COMPLETED(every=2) | Events.COMPLETED
        >>> len(events)
        3
    """

    __slots__ = ("_events",)

    def __init__(self, events: Iterable[EventEnum | FilteredEvent | str] = ()) -> None:
        self._events: list[EventEnum | FilteredEvent | str] = []
        for e in events:
            self._append(e)

    def _append(self, event: object) -> None:
        if not isinstance(event, EventEnum | FilteredEvent | str):
            raise TypeError(
                f"An EventsList holds events (Events.X, Events.X(every=...), or a registered name); "
                f"got {type(event).__name__} {event!r}."
            )
        self._events.append(event)

    def __or__(self, other: Any) -> EventsList:
        out = EventsList(self._events)
        for e in other if isinstance(other, EventsList) else [other]:
            out._append(e)
        return out

    def __iter__(self) -> Iterator[EventEnum | FilteredEvent | str]:
        return iter(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, index: int) -> EventEnum | FilteredEvent | str:
        return self._events[index]

    def __repr__(self) -> str:
        return " | ".join(repr(e) for e in self._events)


def base_event(event: EventEnum | FilteredEvent | str) -> EventEnum | str:
    """The event a (possibly filtered) event fires on."""
    return event.event if isinstance(event, FilteredEvent) else event
