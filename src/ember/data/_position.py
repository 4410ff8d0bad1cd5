"""The resumable-iterator protocol (Grain's) as ember's data wrappers pass it through.

An iterator with a position has ``get_state()`` and ``set_state(state)``; one that runs work in the background (Grain's
worker processes) also has ``close()``. A wrapper that yields one batch per batch of the iterator it wraps
([`Mapped`][ember.data.Mapped]) has the same position, so engines save and restore it through any number of wrappers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def has_position(it: object) -> bool:
    """Whether iterator ``it`` follows the resumable-iterator protocol (``get_state`` and ``set_state``)."""
    return callable(getattr(it, "get_state", None)) and callable(getattr(it, "set_state", None))


def close_iterator(it: object) -> None:
    """Stop what ``it`` runs in the background (Grain's worker processes), if it has ``close()``."""
    close = getattr(it, "close", None)
    if callable(close):
        close()


def restore(it: object, state: Any) -> None:
    """``it.set_state(state)``, or a clear error when ``it`` has no position to restore."""
    if not has_position(it):
        raise TypeError(f"This data's iterator ({type(it).__name__}) has no set_state() to restore a position with.")
    it.set_state(state)  # type: ignore[attr-defined]  # has_position() checked it


class Mapped(Iterator[Any]):
    """``fn`` applied to each batch of iterator ``it``; the position (``None`` if ``it`` has none) is ``it``'s.

    Write a data wrapper's ``__iter__`` with it and an engine still saves and restores the wrapped data's
    position, and still closes its workers.

    Examples:
        >>> import numpy as np
        >>> from ember.data import ArrayDataset, Mapped
        >>> it = Mapped(iter(ArrayDataset(np.arange(4), batch_size=2)), lambda b: b * 10)
        >>> next(it).tolist(), it.get_state()["position"]
        ([0, 10], 1)
    """

    def __init__(self, it: Iterator[Any], fn: Callable[[Any], Any]) -> None:
        self._it, self._fn = it, fn
        self._has_position = has_position(it)

    def __next__(self) -> Any:
        return self._fn(next(self._it))

    def get_state(self) -> Any:
        """The wrapped iterator's position, ``None`` if it has none."""
        return self._it.get_state() if self._has_position else None  # type: ignore[attr-defined]

    def set_state(self, state: Any) -> None:
        """Restore the wrapped iterator's position."""
        restore(self._it, state)

    def close(self) -> None:
        """Close the wrapped iterator."""
        close_iterator(self._it)
