"""`RemovableEventHandle`: what registering returns, and one handle for everything an ``attach`` registered."""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ember.engine._dispatch import Dispatch, Registration
    from ember.engine._events import EventEnum, EventsList, FilteredEvent


class EventHandlers(Protocol):
    """What a handle needs of an engine: the dispatch table of an event (the registry, without importing it)."""

    def _dispatch_of(self, event: EventEnum | str) -> Dispatch: ...


class RemovableEventHandle:
    """What registering a handler returns: ``remove()`` takes exactly that registration away.

    A stock handler's ``attach`` returns one handle for everything it registered, on every engine it touched
    (made with [`collect_handles`][ember.engine.collect_handles]), so ``remove()`` leaves the engines as they were.
    It holds weak references only, so it keeps neither the engines nor the handler alive. ``remove()``
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

    __slots__ = ("_done", "_regs", "_undo", "engine", "event", "handler")

    event: EventEnum | FilteredEvent | EventsList | str | None
    engine: Callable[[], EventHandlers | None]
    handler: Callable[[], Any]

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
        self._regs: list[tuple[weakref.ref[EventHandlers], weakref.ref[Registration]]] = [
            (self.engine, weakref.ref(r)) for r in regs
        ]
        self._undo: list[Callable[[], None]] = []  # what else remove() undoes (work folded into a compiled step)
        self._done = False

    def remove(self) -> None:
        """Remove the registrations (a shared one once its last owner removes it); a second call does nothing."""
        if self._done:
            return
        self._done = True
        for engine_ref, ref in self._regs:
            engine, reg = engine_ref(), ref()
            if engine is not None and reg is not None:
                reg.users -= 1
                if reg.users <= 0:
                    engine._dispatch_of(reg.event).remove(reg)
        for undo in self._undo:
            undo()

    @property
    def active(self) -> bool:
        """Whether any of its registrations is still on its engine (removed by neither this handle nor another)."""
        if self._done:
            return False
        for engine_ref, ref in self._regs:
            reg = ref()
            if engine_ref() is not None and reg is not None and reg.users > 0:
                return True
        return False

    def share(self) -> RemovableEventHandle:
        """Another owner of the same registrations: they stay until every owner's handle is removed.

        Handlers that share one thing on an engine (loggers sharing one writer's flush) each hold a share, so
        removing one of them leaves what the others still use.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> first = engine.add_event_handler(Events.COMPLETED, print)
            >>> second = first.share()
            >>> first.remove(); engine.has_event_handler(print)
            True
            >>> second.remove(); engine.has_event_handler(print)
            False
        """
        copy = object.__new__(RemovableEventHandle)
        copy.event, copy.handler, copy.engine, copy._regs, copy._undo, copy._done = (
            self.event,
            self.handler,
            self.engine,
            list(self._regs),
            [],  # the first owner's handle undoes the rest
            False,
        )
        for _, ref in self._regs:
            reg = ref()
            if reg is not None:
                reg.users += 1
        return collected(copy)

    @property
    def event_name(self) -> EventEnum | FilteredEvent | EventsList | str | None:
        """The event as registered, by Ignite's name."""
        return self.event

    def __enter__(self) -> RemovableEventHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        more = f", {len(self._regs)} registrations" if len(self._regs) > 1 else ""
        return f"RemovableEventHandle(event={self.event!r}, handler={self.handler()!r}{more})"


class HandleCollection:
    """The handles registered inside a [`collect_handles`][ember.engine.collect_handles] block."""

    def __init__(self) -> None:
        self.handles: list[RemovableEventHandle] = []
        self.undos: list[Callable[[], None]] = []

    def on_remove(self, undo: Callable[[], None]) -> None:
        """Have the block's handle (and every enclosing block's) also call ``undo`` when it is removed.

        For what an ``attach`` does besides registering handlers: a check folded into a training engine's compiled
        step is taken out again by the same ``remove()``.

        Examples:
            >>> from ember import Engine, Events
            >>> from ember.engine import collect_handles
            >>> undone = []
            >>> with collect_handles() as made:
            ...     _ = Engine(lambda e, b: b).add_event_handler(Events.STARTED, print)
            ...     made.on_remove(lambda: undone.append(True))
            >>> made.handle.remove(); undone
            [True]
        """
        stack: list[HandleCollection] = _collecting.__dict__.get("stack", [])
        once = _once(undo)  # the inner handle and an outer one both undo it: it runs the first time only
        for made in (*stack[: stack.index(self)], self) if self in stack else (self,):
            made.undos.append(once)

    @property
    def handle(self) -> RemovableEventHandle:
        """One handle whose ``remove()`` removes every registration of the block (its first one names it).

        A block that registered nothing (a progress bar on a process that draws none) gives a handle whose
        ``event`` is ``None`` and whose ``remove()`` does nothing.
        """
        joined = object.__new__(RemovableEventHandle)
        if self.handles:
            first = self.handles[0]
            joined.event, joined.handler, joined.engine = first.event, first.handler, first.engine
        else:
            joined.event, joined.handler, joined.engine = None, _nothing, _nothing
        joined._regs = [pair for h in self.handles for pair in h._regs]
        joined._undo = [*(u for h in self.handles for u in h._undo), *self.undos]
        joined._done = False
        return joined


_collecting = threading.local()


@contextmanager
def collect_handles() -> Generator[HandleCollection, None, None]:
    """Collect every handler registered in the block, on any engine, into one removable handle.

    A handler whose ``attach`` registers several functions (or on several engines) returns ``made.handle``, so
    that one ``remove()`` undoes the whole ``attach``; ``made.on_remove(undo)`` adds what else the attach must undo
    (a check folded into a trainer's compiled step). Blocks nest: an outer block collects what inner ones did.

    Examples:
        >>> from ember import Engine, Events
        >>> from ember.engine import collect_handles
        >>> engine = Engine(lambda engine, batch: None)
        >>> with collect_handles() as made:
        ...     _ = engine.add_event_handler(Events.STARTED, print)
        ...     _ = engine.add_event_handler(Events.COMPLETED, print)
        >>> made.handle.remove()
        >>> engine.has_event_handler(print)
        False
    """
    stack: list[HandleCollection] = _collecting.__dict__.setdefault("stack", [])
    made = HandleCollection()
    stack.append(made)
    try:
        yield made
    finally:
        stack.remove(made)


def collected(handle: RemovableEventHandle) -> RemovableEventHandle:
    """Hand a new registration's handle to every open `collect_handles` block; return it."""
    for made in _collecting.__dict__.get("stack", ()):
        made.handles.append(handle)
    return handle


def _once(undo: Callable[[], None]) -> Callable[[], None]:
    """``undo``, called the first time only."""
    done: list[bool] = []

    def call() -> None:
        if not done:
            done.append(True)
            undo()

    return call


def _nothing() -> None:
    """The handler and engine of a handle that registered nothing."""


def _weak(obj: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(obj)
    except TypeError:  # objects that cannot be weakly referenced (functools.partial of a builtin, ...)
        return lambda: obj
