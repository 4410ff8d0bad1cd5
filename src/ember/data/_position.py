"""`Mapped`: a data wrapper that passes the wrapped iterator's position through.

The protocol ([`ResumableIterator`][ember.data.ResumableIterator]) and its helpers are in ``ember._protocols``, which
the engine uses too. A wrapper that yields one batch per batch of the iterator it wraps has the same position, so
engines save and restore it through any number of wrappers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ember._protocols import ResumableIterator, close, restore


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

    def __next__(self) -> Any:
        return self._fn(next(self._it))

    def get_state(self) -> Any:
        """The wrapped iterator's position, ``None`` if it has none."""
        return self._it.get_state() if isinstance(self._it, ResumableIterator) else None

    def set_state(self, state: Any) -> None:
        """Restore the wrapped iterator's position."""
        restore(self._it, state)

    def close(self) -> None:
        """Close the wrapped iterator."""
        close(self._it)
