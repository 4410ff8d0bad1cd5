"""`EventHandlers`: the engine's registry of events and handlers (Ignite's registration API)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ember.engine._dispatch import Dispatch, Registration, check_handler
from ember.engine._events import EventEnum, Events, EventsList, FilteredEvent, base_event
from ember.engine._handles import RemovableEventHandle, collected

# The counter each built-in event's filters see.
_EVENT_TO_ATTR: dict[EventEnum | str, str] = {
    Events.STARTED: "epoch",
    Events.EPOCH_STARTED: "epoch",
    Events.EPOCH_COMPLETED: "epoch",
    Events.TERMINATE_SINGLE_EPOCH: "epoch",
    Events.TERMINATE: "epoch",
    Events.COMPLETED: "epoch",
    Events.GET_BATCH_STARTED: "iteration",
    Events.GET_BATCH_COMPLETED: "iteration",
    Events.DATALOADER_STOP_ITERATION: "iteration",
    Events.ITERATION_STARTED: "iteration",
    Events.ITERATION_COMPLETED: "iteration",
    Events.INTERRUPT: "iteration",
    Events.EXCEPTION_RAISED: "iteration",
}


class EventHandlers:
    """Registers events and handlers on an engine and fires them; [`Engine`][ember.engine.Engine] is one.

    Its own state: one `Dispatch` per event (``_dispatch``, which the engine's run loop fires) and the counter each
    event's filters read. It is the engine's only base class, as Ignite's registration API is its ``Engine``'s.

    Examples:
        >>> from ember import Engine, Events
        >>> engine = Engine(lambda engine, batch: None)
        >>> _ = engine.add_event_handler(Events.COMPLETED, lambda: print("done"))
        >>> engine.has_event_handler(print), engine.run([0]).iteration
        done
        (False, 1)
    """

    state: Any  # the engine's State
    last_event_name: EventEnum | str | None

    def __init__(self) -> None:
        self._dispatch: dict[EventEnum | str, Dispatch] = {e: Dispatch() for e in Events}
        self._event_to_attr: dict[EventEnum | str, str] = dict(_EVENT_TO_ATTR)

    def register_events(
        self, *events: EventEnum | str, event_to_attr: Mapping[EventEnum | str, str] | None = None
    ) -> None:
        """Allow custom events to be fired and handled on this engine.

        Args:
            *events: [`EventEnum`][ember.engine.EventEnum] members or plain strings.
            event_to_attr: for events that take filters, the name of the ``state`` counter the filter
                reads; the counter is created (at 0) on this engine's state. The mapping belongs to this
                engine only.

        Raises:
            TypeError: an event is neither an ``EventEnum`` member nor a string.
            ValueError: ``event_to_attr`` is not a mapping, or names an event not being registered.

        Examples:
            >>> from ember import Engine, EventEnum
            >>> class TBPTT(EventEnum):
            ...     TIME_ITERATION_COMPLETED = "time_iteration_completed"
            >>> engine = Engine(lambda engine, batch: None)
            >>> engine.register_events(*TBPTT, event_to_attr={TBPTT.TIME_ITERATION_COMPLETED: "time_iteration"})
            >>> engine.state.time_iteration
            0
        """
        if event_to_attr is not None and not isinstance(event_to_attr, Mapping):
            raise ValueError(
                f"`event_to_attr` must be a mapping of event to state attribute name, got "
                f"{type(event_to_attr).__name__} {event_to_attr!r}."
            )
        for e in events:
            if not isinstance(e, EventEnum | str):
                raise TypeError(f"register_events takes EventEnum members or strings, got {type(e).__name__} {e!r}.")
            self._dispatch.setdefault(e, Dispatch())
        for e, attr in (event_to_attr or {}).items():
            if e not in self._dispatch:
                raise ValueError(f"`event_to_attr` maps {e!r}, which is not registered; pass it in `events` too.")
            if not isinstance(attr, str) or not attr.isidentifier():
                raise ValueError(f"`event_to_attr` values must be attribute names, got {attr!r} for {e!r}.")
            self._event_to_attr[e] = attr
            if not hasattr(self.state, attr):
                setattr(self.state, attr, 0)

    def has_registered_events(self, event: Any) -> bool:
        """Whether ``event`` may be fired and handled on this engine: a built-in event, or one registered.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda e, b: b)
            >>> engine.register_events("backward_completed")
            >>> engine.has_registered_events(Events.STARTED), engine.has_registered_events("backward_completed")
            (True, True)
            >>> engine.has_registered_events("forward_completed")
            False
        """
        try:
            return base_event(event) in self._dispatch
        except TypeError:  # unhashable: not an event
            return False

    def get_event_attrib_value(self, event: EventEnum | str) -> int:
        """The ``state`` counter ``event`` counts by: the epoch for epoch events, the iteration for iteration ones.

        Ignite has it on ``engine.state``; here the mapping is the engine's own (custom events register theirs with
        [`register_events`][ember.engine.Engine.register_events]). A filtered event counts by its event's counter.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda e, b: b)
            >>> _ = engine.run([1, 2, 3], max_epochs=2)
            >>> value = engine.get_event_attrib_value
            >>> value(Events.EPOCH_COMPLETED), value(Events.ITERATION_COMPLETED(every=2))
            (2, 6)
        """
        base = base_event(event)
        attr = self._event_to_attr.get(base)
        if attr is None:
            raise ValueError(f"{event!r} counts by no state attribute; register it with event_to_attr= to name one.")
        return getattr(self.state, attr)

    def _dispatch_of(self, event: EventEnum | str) -> Dispatch:
        try:
            return self._dispatch[event]
        except KeyError:
            raise ValueError(
                f"{event!r} is not an event of this engine; register it with engine.register_events({event!r})."
            ) from None
        except TypeError:
            raise TypeError(
                f"Expected an event (Events.X, Events.X(...), or a registered name), got {event!r}."
            ) from None

    def add_event_handler(
        self,
        event: EventEnum | FilteredEvent | EventsList | str,
        handler: Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> RemovableEventHandle:
        """Register ``handler`` to run when ``event`` fires; return a handle that removes it.

        The handler is called as ``handler(engine, *args, **kwargs)``, or ``handler(*args, **kwargs)`` if it does not
        take the engine; on ``EXCEPTION_RAISED`` the exception comes right after the engine. Handlers of one event run
        in registration order. An [`EventsList`][ember.engine.EventsList] registers the handler once per element.

        Args:
            event: the event, possibly filtered, or an ``EventsList``.
            handler: the callable to run.
            *args: extra positional arguments for the handler.
            **kwargs: extra keyword arguments for the handler.

        Returns:
            A [`RemovableEventHandle`][ember.engine.RemovableEventHandle].

        Raises:
            ValueError: the event is not registered, or is filtered but has no counter, or the handler
                cannot be called with what the engine will pass (Ignite's type).
            TypeError: the handler is not callable.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> handle = engine.add_event_handler(Events.COMPLETED, print, "done")
            >>> _ = engine.run([1])
            <ember.engine._engine.Engine object at ...> done
            >>> handle.remove()
        """
        return self._register(event, handler, args, kwargs, priority=False)

    def add_priority_handler(
        self,
        event: EventEnum | FilteredEvent | EventsList | str,
        handler: Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> RemovableEventHandle:
        """Like ``add_event_handler``, but the handler runs before the event's ordinary handlers.

        Priority handlers run among themselves in registration order. Metrics use this, so a logger
        attached before a metric still sees the metric's fresh value.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> order = []
            >>> _ = engine.add_event_handler(Events.COMPLETED, lambda: order.append("logger"))
            >>> _ = engine.add_priority_handler(Events.COMPLETED, lambda: order.append("metric"))
            >>> _ = engine.run([1])
            >>> order
            ['metric', 'logger']
        """
        return self._register(event, handler, args, kwargs, priority=True)

    def _register(
        self,
        event: EventEnum | FilteredEvent | EventsList | str,
        handler: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        priority: bool,
    ) -> RemovableEventHandle:
        events = list(event) if isinstance(event, EventsList) else [event]
        checked = [self._check_registration(e, handler, args, kwargs) for e in events]
        regs: list[Registration] = []
        for e, takes_engine in checked:
            base = base_event(e)
            filt = e.rule.bind() if isinstance(e, FilteredEvent) else None
            reg = Registration(base, handler, filt, args, kwargs, takes_engine)
            reg.priority = priority
            self._dispatch[base].add(reg)
            regs.append(reg)
        return collected(RemovableEventHandle(event, handler, self, regs))

    def _check_registration(
        self, event: object, handler: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[EventEnum | FilteredEvent | str, bool]:
        if not isinstance(event, EventEnum | FilteredEvent | str):
            raise TypeError(f"Expected an event (Events.X, Events.X(...), or a registered name), got {event!r}.")
        base = base_event(event)
        self._dispatch_of(base)
        if isinstance(event, FilteredEvent) and base not in self._event_to_attr:
            raise ValueError(
                f"{event!r} has a filter but {base!r} has no counter to filter on; register it with "
                f"event_to_attr={{{base!r}: 'name'}}."
            )
        event_args = (Exception(),) if base is Events.EXCEPTION_RAISED else ()
        return event, check_handler(handler, event, event_args, args, kwargs)

    def on(self, event: EventEnum | FilteredEvent | EventsList | str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        """Decorator form of ``add_event_handler``; returns the function unchanged.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> @engine.on(Events.EPOCH_STARTED(once=2))
            ... def second_epoch(engine):
            ...     print("epoch", engine.state.epoch)
            >>> _ = engine.run([1], max_epochs=3)
            epoch 2
        """

        def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add_event_handler(event, fn, *args, **kwargs)
            return fn

        return decorator

    def has_event_handler(
        self, handler: Callable[..., Any], event: EventEnum | FilteredEvent | str | None = None
    ) -> bool:
        """Whether ``handler`` is registered on ``event`` (with any filter), or on any event if ``None``.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> _ = engine.add_event_handler(Events.ITERATION_COMPLETED(every=10), print)
            >>> engine.has_event_handler(print, Events.ITERATION_COMPLETED)
            True
            >>> engine.has_event_handler(print, Events.EPOCH_COMPLETED)
            False
        """
        if event is None:
            dispatches: Iterable[Dispatch] = self._dispatch.values()
        else:
            d = self._dispatch.get(base_event(event))
            dispatches = [d] if d is not None else []
        return any(r.handler == handler for d in dispatches for r in d.regs)

    def wrap_handlers(
        self, wrap: Callable[[EventEnum | str, Callable[..., Any], Callable[..., Any]], Callable[..., Any]]
    ) -> Callable[[], None]:
        """Run every handler registered now through ``wrap(event, handler, call)``; return the undo.

        ``call(engine, *event_args)`` runs the handler as registered; what ``wrap`` returns runs in its
        place (a profiler times the call). Handlers registered later are not wrapped. The function
        returned puts the original calls back. Nothing of this costs anything until it is used.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> _ = engine.add_event_handler(Events.COMPLETED, lambda: print("done"))
            >>> def announce(event, handler, call):
            ...     return lambda engine, *args: (print(f"{event.name}:"), call(engine, *args))
            >>> undo = engine.wrap_handlers(announce)
            >>> _ = engine.run([0])
            COMPLETED:
            done
            >>> undo()
        """
        wrapped = []
        for event, d in self._dispatch.items():
            for reg in d.regs:
                original = reg.call
                reg.call = wrap(event, reg.handler, original)
                wrapped.append((reg, original, reg.call))

        def undo() -> None:
            for reg, original, call in wrapped:
                if reg.call is call:  # not removed since
                    reg.call = original

        return undo

    def remove_event_handler(self, handler: Callable[..., Any], event: EventEnum | FilteredEvent | str) -> None:
        """Remove every registration of ``handler`` on ``event``, whatever filters they had.

        Raises:
            ValueError: the event is not registered, or the handler is not registered on it.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> _ = engine.add_event_handler(Events.COMPLETED, print)
            >>> engine.remove_event_handler(print, Events.COMPLETED)
            >>> engine.has_event_handler(print)
            False
        """
        d = self._dispatch_of(base_event(event))
        found = [r for r in d.regs if r.handler == handler]
        if not found:
            raise ValueError(f"Handler {handler!r} is not registered on {event!r}.")
        for r in found:
            d.remove(r)

    def fire_event(self, event: EventEnum | str) -> None:
        """Run the handlers of a registered event now; custom events are fired this way.

        Raises:
            ValueError: the event is not registered on this engine.
            TypeError: a filtered event was given; fire its base event.

        Examples:
            >>> from ember import Engine
            >>> engine = Engine(lambda engine, batch: None)
            >>> engine.register_events("checkpoint_saved")
            >>> _ = engine.add_event_handler("checkpoint_saved", lambda: print("saved"))
            >>> engine.fire_event("checkpoint_saved")
            saved
        """
        if isinstance(event, FilteredEvent):
            raise TypeError(f"fire_event takes the base event, not a filtered one: use {event.event!r}.")
        d = self._dispatch_of(event)
        attr = self._event_to_attr.get(event)
        self.last_event_name = event
        if d.regs:
            d.fire(self, getattr(self.state, attr) if attr else 0)
