"""The event engine: `Engine`, `Events`, filters and handles. Pure Python; it does not import JAX."""

from ember._protocols import Stateful, TreeStateful
from ember.engine._engine import Engine
from ember.engine._events import EventEnum, Events, EventsList, FilteredEvent
from ember.engine._handles import RemovableEventHandle, collect_handles
from ember.engine._state import State

__all__ = [
    "Engine",
    "EventEnum",
    "Events",
    "EventsList",
    "FilteredEvent",
    "RemovableEventHandle",
    "State",
    "Stateful",
    "TreeStateful",
    "collect_handles",
]
