"""Event filters: which counter values of an event a handler fires on.

A filter answers two questions. ``filter(engine, value)`` says whether a handler fires at counter
``value``; ``next_due(value)`` gives the smallest later value at which it can fire. The engine uses
``next_due`` to skip whole runs of values with one integer comparison, so a handler attached with
``every=100`` costs nothing on the 99 iterations where it does not fire.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterable
from typing import Any

#: A counter value no run reaches: "this filter never fires again".
NEVER = 1 << 62

#: ``event_filter(engine, value) -> bool``, as in Ignite.
FilterFn = Callable[[Any, int], bool]


class EventFilter:
    """Base of the filters built by ``Events.X(...)``; a filter is a callable ``(engine, value) -> bool``."""

    def __call__(self, engine: Any, value: int) -> bool:
        raise NotImplementedError

    def next_due(self, value: int) -> int:
        """The smallest counter value after ``value`` at which this filter may fire."""
        return value + 1

    def bind(self) -> EventFilter:
        """A copy for one registration; stateful filters return a fresh one, the others themselves."""
        return self

    def reset(self) -> None:
        """Forget per-run state; the engine calls this when a run starts from iteration 0."""

    def describe(self) -> str:
        """The keyword arguments that built this filter, as written: ``every=5, after=8``."""
        raise NotImplementedError


class Every(EventFilter):
    """Fires at every ``every``-th value inside the exclusive bounds ``(after, before)``.

    Without ``after`` the values are ``every, 2 * every, ...``; with ``after`` the count starts at
    ``after + 1``: ``every=5, after=8`` fires at 9, 14, 19, ...
    """

    __slots__ = ("after", "before", "every", "first")

    def __init__(self, every: int | None, before: int | None, after: int | None) -> None:
        self.every = every
        self.before = before
        self.after = after
        step = 1 if every is None else every
        self.first = step if after is None else after + 1

    def __call__(self, engine: Any, value: int) -> bool:
        step = 1 if self.every is None else self.every
        return value >= self.first and (value - self.first) % step == 0 and (self.before is None or value < self.before)

    def next_due(self, value: int) -> int:
        step = 1 if self.every is None else self.every
        due = self.first if value < self.first else self.first + ((value - self.first) // step + 1) * step
        return NEVER if self.before is not None and due >= self.before else due

    def describe(self) -> str:
        parts = [f"{name}={getattr(self, name)}" for name in ("every", "before", "after")]
        return ", ".join(p for p in parts if not p.endswith("=None"))


class Once(EventFilter):
    """Fires once at each of the given values, never twice for one registration within a run."""

    __slots__ = ("_fired", "values", "written")

    def __init__(self, values: frozenset[int], written: int | list[int]) -> None:
        self.values = values
        self.written = written
        self._fired: set[int] = set()

    def __call__(self, engine: Any, value: int) -> bool:
        if value in self.values and value not in self._fired:
            self._fired.add(value)
            return True
        return False

    def next_due(self, value: int) -> int:
        later = [v for v in self.values if v > value and v not in self._fired]
        return min(later) if later else NEVER

    def bind(self) -> EventFilter:
        return Once(self.values, self.written)

    def reset(self) -> None:
        self._fired.clear()

    def describe(self) -> str:
        return f"once={self.written!r}"


class EverySeconds(EventFilter):
    """Fires when at least ``seconds`` have passed since it last fired (or since it was first asked)."""

    __slots__ = ("_last", "clock", "seconds")

    def __init__(self, seconds: float, clock: Callable[[], float]) -> None:
        self.seconds = seconds
        self.clock = clock
        self._last: float | None = None

    def __call__(self, engine: Any, value: int) -> bool:
        now = self.clock()
        if self._last is None:
            self._last = now
            return False
        if now - self._last >= self.seconds:
            self._last = now
            return True
        return False

    def bind(self) -> EventFilter:
        return EverySeconds(self.seconds, self.clock)

    def reset(self) -> None:
        self._last = None

    def describe(self) -> str:
        return f"every_secs={self.seconds!r}"


class Custom(EventFilter):
    """Wraps a user function ``event_filter(engine, value) -> bool``."""

    __slots__ = ("fn",)

    def __init__(self, fn: FilterFn) -> None:
        self.fn = fn

    def __call__(self, engine: Any, value: int) -> bool:
        return bool(self.fn(engine, value))

    def describe(self) -> str:
        return f"event_filter={getattr(self.fn, '__qualname__', repr(self.fn))}"


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_positive(name: str, value: object) -> None:
    if not _is_int(value) or value <= 0:  # type: ignore[operator]  # _is_int checked the type first
        raise ValueError(f"`{name}` must be a positive int, got {value!r}.")


def _check_filter_fn(fn: object) -> None:
    if not callable(fn):
        raise TypeError(f"`event_filter` must be callable as event_filter(engine, value), got {fn!r}.")
    try:
        inspect.signature(fn).bind(None, 0)
    except TypeError as e:
        raise ValueError(
            f"`event_filter` must accept two arguments (engine, value); "
            f"{getattr(fn, '__qualname__', fn)!s}{inspect.signature(fn)} does not: {e}."
        ) from None
    except ValueError:  # no signature to inspect (a builtin): trust it
        pass


def make_filter(
    event_filter: FilterFn | None = None,
    *,
    every: int | None = None,
    once: int | Iterable[int] | None = None,
    before: int | None = None,
    after: int | None = None,
    every_secs: float | None = None,
    clock: Callable[[], float] | None = None,
) -> EventFilter:
    """Validate the arguments of ``Events.X(...)`` and build the filter they describe."""
    kinds = {
        "event_filter": event_filter is not None,
        "every/before/after": every is not None or before is not None or after is not None,
        "once": once is not None,
        "every_secs": every_secs is not None,
    }
    chosen = [k for k, given in kinds.items() if given]
    if len(chosen) != 1:
        what = "none" if not chosen else " and ".join(chosen)
        raise ValueError(
            "An event filter takes exactly one of `event_filter`, `every` (with optional `before`/`after`), "
            f"`once` or `every_secs`; got {what}."
        )
    if clock is not None and every_secs is None:
        raise ValueError("`clock` only applies to `every_secs`; pass `every_secs` too or drop `clock`.")
    if event_filter is not None:
        _check_filter_fn(event_filter)
        return Custom(event_filter)
    if once is not None:
        return _make_once(once)
    if every_secs is not None:
        if isinstance(every_secs, bool) or not isinstance(every_secs, int | float) or every_secs <= 0:
            raise ValueError(f"`every_secs` must be a positive number of seconds, got {every_secs!r}.")
        if clock is not None and not callable(clock):
            raise TypeError(f"`clock` must be a callable returning seconds, got {clock!r}.")
        return EverySeconds(float(every_secs), clock or time.monotonic)
    if every is not None:
        _check_positive("every", every)
    for name, bound in (("before", before), ("after", after)):
        if bound is not None and (not _is_int(bound) or bound < 0):
            raise ValueError(f"`{name}` must be a non-negative int, got {bound!r}.")
    if before is not None and after is not None and before <= after + 1:
        raise ValueError(
            f"`before` and `after` are exclusive bounds; before={before}, after={after} leave no value to fire on."
        )
    return Every(every, before, after)


def _make_once(once: int | Iterable[int]) -> Once:
    if _is_int(once):
        _check_positive("once", once)
        # the ignore below: once is an int here: the branch above handled collections
        return Once(frozenset([once]), once)  # type: ignore[list-item]
    if isinstance(once, Iterable) and not isinstance(once, str | bytes):
        values = list(once)
        if not values:
            raise ValueError("`once` must be a positive int or a non-empty list of positive ints, got [].")
        for v in values:
            _check_positive("once", v)
        return Once(frozenset(values), values)
    raise ValueError(f"`once` must be a positive int or a non-empty list of positive ints, got {once!r}.")
