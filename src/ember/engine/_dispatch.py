"""Handler registrations, the per-event dispatch table, and the removable handle.

Each event owns one `Dispatch`: its registrations in order, plus a skip window ``(last, due)``. When
the counter value lies strictly inside the window no filter can fire, so firing costs one
comparison. The window is recomputed only when some handler might fire, and is invalidated whenever
the registrations change.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ember.engine._filters import NEVER, EventFilter

if TYPE_CHECKING:
    from ember.engine._events import EventEnum, EventsList, FilteredEvent
    from ember.engine._handlers import EventHandlers

HandlerCall = Callable[..., Any]


class Registration:
    """One handler registered on one event, with its own copy of the filter."""

    __slots__ = ("__weakref__", "args", "call", "event", "filter", "handler", "kwargs", "priority")

    def __init__(
        self,
        event: EventEnum | str,
        handler: Callable[..., Any],
        filter: EventFilter | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        takes_engine: bool,
    ) -> None:
        self.event = event
        self.handler = handler
        self.filter = filter
        self.args = args
        self.kwargs = kwargs
        self.call = _make_call(handler, args, kwargs, takes_engine)
        self.priority = False


def _make_call(
    handler: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], takes_engine: bool
) -> HandlerCall:
    if takes_engine and not args and not kwargs:
        return handler

    def call(engine: Any, *extra: Any) -> Any:
        if takes_engine:
            return handler(engine, *extra, *args, **kwargs)
        return handler(*extra, *args, **kwargs)

    return call


def _removed(engine: Any, *extra: Any) -> None:
    """Stands in for a handler removed while its event was being dispatched."""


class Dispatch:
    """The registrations of one event, in registration order."""

    __slots__ = ("due", "last", "regs")

    def __init__(self) -> None:
        self.regs: tuple[Registration, ...] = ()
        self.last = -1
        self.due = -1

    def add(self, reg: Registration) -> None:
        """Append a registration (priority ones after the other priority ones, before the rest)."""
        if reg.priority:
            at = sum(1 for r in self.regs if r.priority)
            self.regs = (*self.regs[:at], reg, *self.regs[at:])
        else:
            self.regs = (*self.regs, reg)
        self.due = -1

    def remove(self, reg: Registration) -> bool:
        """Remove one registration; ``False`` if it was not there."""
        if reg not in self.regs:
            return False
        self.regs = tuple(r for r in self.regs if r is not reg)
        reg.call = _removed
        reg.filter = None
        self.due = -1
        return True

    def fire(self, engine: Any, value: int, *extra: Any) -> None:
        """Call, in order, every handler whose filter accepts ``value``."""
        if self.last < value < self.due:
            return
        self.last = value
        regs = self.regs
        due = NEVER
        for r in regs:
            f = r.filter
            if f is None:
                r.call(engine, *extra)
                due = value + 1
            else:
                if f(engine, value):
                    r.call(engine, *extra)
                nxt = f.next_due(value)
                if nxt < due:
                    due = nxt
        if self.regs is regs:  # a handler that changed the registrations has already invalidated the window
            self.due = due


def check_handler(
    handler: Callable[..., Any],
    event: object,
    event_args: tuple[Any, ...],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> bool:
    """Whether ``handler`` takes the engine first; raise if it can take neither form.

    A handler may be called as ``handler(engine, *event_args, *args, **kwargs)`` or, without the
    engine, as ``handler(*event_args, *args, **kwargs)``.
    """
    if not callable(handler):
        raise TypeError(f"`handler` must be callable, got {type(handler).__name__} {handler!r}.")
    try:
        sig = inspect.signature(handler)
    except (TypeError, ValueError):  # builtins without a signature: trust them to take the engine
        return True
    try:
        sig.bind(None, *event_args, *args, **kwargs)
        return True
    except TypeError:
        pass
    try:
        sig.bind(*event_args, *args, **kwargs)
        return False
    except TypeError:
        name = getattr(handler, "__qualname__", repr(handler))
        given = ", ".join(
            [
                *("<exception>" for _ in event_args),
                *map(repr, args),
                *(f"{k}={v!r}" for k, v in kwargs.items()),
            ]
        )
        raise ValueError(
            f"Handler `{name}{sig}` cannot be called on {event!r}: it will receive "
            f"(engine{', ' + given if given else ''}) or ({given}). "
            "Change its parameters or the arguments passed to add_event_handler."
        ) from None


class RemovableEventHandle:
    """What registering a handler returns: ``remove()`` takes exactly that registration away.

    It holds weak references only, so it keeps neither the engine nor the handler alive. ``remove()``
    is idempotent, and the handle is a context manager that removes the handler on exit.

    Attributes:
        event: the event as registered (Ignite's ``event_name`` is the same).
        handler: a weak reference to the handler: ``handle.handler()`` is the handler, or ``None`` once collected.
        engine: a weak reference to the engine, as Ignite's: ``handle.engine()``.

    Examples:
        >>> from ember import Engine, Events
        >>> engine = Engine(lambda engine, batch: None)
        >>> seen = []
        >>> def log_epoch(engine):
        ...     seen.append(engine.state.epoch)
        >>> with engine.add_event_handler(Events.EPOCH_COMPLETED, log_epoch):
        ...     _ = engine.run([0], max_epochs=2)
        >>> seen
        [1, 2]
        >>> engine.has_event_handler(log_epoch)
        False
        >>> handle = engine.add_event_handler(Events.STARTED, print)
        >>> handle.engine() is engine, handle.event_name
        (True, Events.STARTED)
    """

    __slots__ = ("_regs", "engine", "event", "handler")

    def __init__(
        self,
        event: EventEnum | FilteredEvent | EventsList | str,
        handler: Callable[..., Any],
        engine: EventHandlers,
        regs: list[Registration],
    ) -> None:
        self.event = event
        self.handler = weakref.WeakMethod(handler) if inspect.ismethod(handler) else _weak(handler)
        self.engine = weakref.ref(engine)
        self._regs = [weakref.ref(r) for r in regs]

    def remove(self) -> None:
        """Remove the registration; nothing happens if it is already gone."""
        engine = self.engine()
        if engine is None:
            return
        for ref in self._regs:
            reg = ref()
            if reg is not None:
                engine._dispatch_of(reg.event).remove(reg)

    @property
    def event_name(self) -> EventEnum | FilteredEvent | EventsList | str:
        """The event as registered, by Ignite's name."""
        return self.event

    def __enter__(self) -> RemovableEventHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"RemovableEventHandle(event={self.event!r}, handler={self.handler()!r})"


def _weak(obj: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(obj)
    except TypeError:  # objects that cannot be weakly referenced (functools.partial of a builtin, ...)
        return lambda: obj
