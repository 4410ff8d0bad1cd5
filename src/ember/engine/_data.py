"""The engine's side of resumable data: where the live iterator stands, reopening data there, letting go.

The protocol is Grain's, so Grain's loaders and datasets need no adapter: an iterator that knows its
position has ``get_state()`` and ``set_state(state)``, and ``iter(data)`` followed by
``set_state(saved)`` continues exactly where the saved iterator stood. An iterator that also has
``close()`` holds resources (Grain's worker processes); the engine closes it when a run stops, keeping
its position, and reopens the data there if the run goes on.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


def resumable(it: object) -> bool:
    """Whether ``it`` is an iterator that can report and restore its position."""
    return callable(getattr(it, "get_state", None)) and callable(getattr(it, "set_state", None))


def position(it: object) -> Any:
    """The position of iterator ``it`` (``None``: it has none; ember's wrappers say so over data without one)."""
    return it.get_state() if resumable(it) else None  # type: ignore[attr-defined]  # resumable() checked it


def reopen(data: Iterable[Any], state: Any) -> Iterator[Any]:
    """A new iterator over ``data``, set to the saved position ``state``."""
    it = iter(data)
    if not resumable(it):
        raise ValueError(
            f"The engine holds a saved position in its data, but the iterator of this data ({type(it).__name__}) "
            "has no get_state()/set_state() to continue from it. Resume with the data the run was saved with "
            "(an ArrayDataset, a Grain loader or dataset, or any iterable whose iterator has both)."
        )
    it.set_state(state)  # type: ignore[attr-defined]  # resumable() checked it
    return it


def release(it: object) -> Any:
    """Close an iterator that has a position and return the position; ``None`` (nothing done) for any other.

    Other iterators stay open, as Ignite keeps them: a generator continues where it stopped when the run
    does.
    """
    state = position(it)
    if state is None:
        return None
    close = getattr(it, "close", None)
    if callable(close):
        close()
    return state
