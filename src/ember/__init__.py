"""ember: an event-driven training engine for JAX, in the style of PyTorch Ignite."""

from ember._version import __version__
from ember.engine import (
    Engine,
    EventEnum,
    Events,
    EventsList,
    FilteredEvent,
    RemovableEventHandle,
    State,
    Stateful,
    TreeStateful,
    collect_handles,
)

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
    "__version__",
    "collect_handles",
]
