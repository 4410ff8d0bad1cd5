"""Helpers shared by the engine tests: an engine that records every event it fires."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ember import Engine, Events, FilteredEvent


def record(engine: Engine, events: Iterable[Events] = tuple(Events)) -> list[str]:
    """Attach a recorder to every given event; return the list it fills with event names."""
    log: list[str] = []
    for ev in events:
        if ev is Events.EXCEPTION_RAISED:
            engine.add_event_handler(ev, lambda engine, exc, ev=ev: log.append(ev.name))
        else:
            engine.add_event_handler(ev, lambda engine, ev=ev: log.append(ev.name))
    return log


def recording_engine(process: Callable[[Engine, Any], Any] | None = None) -> tuple[Engine, list[str]]:
    """An engine whose process function returns the batch, with every event recorded."""
    engine = Engine(process or (lambda engine, batch: batch))
    return engine, record(engine)


def batches_seen(engine: Engine) -> list[tuple[int, int, Any]]:
    """Attach a recorder of (epoch, iteration, batch) at ITERATION_COMPLETED; return its list."""
    seen: list[tuple[int, int, Any]] = []
    engine.add_event_handler(
        Events.ITERATION_COMPLETED, lambda e: seen.append((e.state.epoch, e.state.iteration, e.state.batch))
    )
    return seen


def terminated_at(event: FilteredEvent, data: Iterable[Any], max_epochs: int) -> Engine:
    """An engine whose run over ``data`` was ended by ``terminate()`` in a handler of ``event``."""
    engine = Engine(lambda engine, batch: batch)
    engine.add_event_handler(event, lambda e: e.terminate())
    engine.run(data, max_epochs=max_epochs)
    return engine
