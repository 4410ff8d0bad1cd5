"""ember: an event-driven training engine for JAX, in the style of PyTorch Ignite."""

from ember.engine import Engine, EventEnum, Events, EventsList, FilteredEvent, RemovableEventHandle, State

__version__ = "0.1.0.dev0"

__all__ = [
    "Engine",
    "EventEnum",
    "Events",
    "EventsList",
    "FilteredEvent",
    "RemovableEventHandle",
    "State",
    "__version__",
]
