"""Handler registrations and the per-event dispatch table.

Each event owns one `Dispatch`: its registrations in order, plus a skip window ``(last, due)``. When
the counter value lies strictly inside the window no filter can fire, so firing costs one
comparison. The window is recomputed only when some handler might fire, and is invalidated whenever
the registrations change.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ember.engine._filters import NEVER, EventFilter

if TYPE_CHECKING:
    from ember.engine._events import EventEnum

HandlerCall = Callable[..., Any]


class Registration:
    """One handler registered on one event, with its own copy of the filter."""

    __slots__ = ("__weakref__", "args", "call", "event", "filter", "handler", "kwargs", "priority", "users")

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
        self.users = 1  # the handles that own it (RemovableEventHandle.share adds one)


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
