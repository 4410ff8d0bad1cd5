"""`DevicePrefetch`: put batches on device ahead of the step that needs them."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ember._protocols import ResumableIterator, close, restore


class DevicePrefetch:
    """Wraps an iterable of host batches; keeps ``size`` batches already transferred ahead.

    ``put`` starts each transfer (``jax.device_put`` is asynchronous), so batch n+1 and n+2 travel while
    step n runs. When the source's iterator has a position (``get_state``/``set_state``), so has this
    wrapper's: that of the batches it handed out, not of those it read ahead, so resuming is exact.

    Args:
        source: any re-iterable of batches (a list, an [`ArrayDataset`][ember.data.ArrayDataset], a loader).
        put: places one batch on device, e.g. ``placement.put_batch``.
        size: how many batches to keep in flight; 0 transfers each batch when it is asked for.
        decide: if given, called with the first batch of each pass (before ``put``); its answer replaces
            ``size``. The trainers use it to prefetch only batches large enough for it to pay.

    Examples:
        >>> import jax
        >>> from ember.data import DevicePrefetch
        >>> batches = DevicePrefetch([1.0, 2.0, 3.0], put=jax.device_put, size=2)
        >>> [float(b) for b in batches], len(batches)
        ([1.0, 2.0, 3.0], 3)
    """

    def __init__(
        self,
        source: Iterable[Any],
        put: Callable[[Any], Any],
        size: int = 2,
        *,
        decide: Callable[[Any], int] | None = None,
    ) -> None:
        if not isinstance(source, Iterable):
            raise TypeError(f"`source` must be an iterable of batches, got {type(source).__name__}.")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"`size` must be a non-negative int, got {size!r}.")
        self.source = source
        self.put = put
        self.size = size
        self.decide = decide

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]  # raises TypeError for unsized sources, as len() should

    def __iter__(self) -> Prefetching:
        return Prefetching(self, iter(self.source))


class Prefetching(Iterator[Any]):
    """One pass of a [`DevicePrefetch`][ember.data.DevicePrefetch]; its position is that of the batches it handed out.

    Over a source whose iterator has ``get_state``/``set_state``, it has them too: the position after the
    latest batch handed out, not after those read ahead (read from the source when nothing is read
    ahead, else recorded as each batch is read). Over other sources ``get_state()`` is ``None``.
    """

    def __init__(self, owner: DevicePrefetch, it: Iterator[Any]) -> None:
        self._owner, self._it = owner, it
        self._positions: ResumableIterator | None = it if isinstance(it, ResumableIterator) else None
        self._queue: collections.deque[tuple[Any, Any]] = collections.deque()
        self._state: Any = None  # the position after the latest batch handed out, when batches are read ahead
        self._first = owner.decide is not None  # the next batch is the pass's first: decide the size on it

    def _read(self) -> bool:
        try:
            batch = next(self._it)
        except StopIteration:
            return False
        if self._first:
            self._first = False
            self._owner.size = self._owner.decide(batch)  # type: ignore[misc]  # set when _first is
        after = self._positions.get_state() if self._positions is not None and self._owner.size else None
        self._queue.append((self._owner.put(batch), after))
        return True

    def __next__(self) -> Any:
        if not self._queue and not self._read():
            raise StopIteration
        batch, self._state = self._queue.popleft()
        while len(self._queue) < self._owner.size and self._read():  # `size` more already travelling
            pass
        return batch

    def get_state(self) -> Any:
        """The source's position after the batches handed out so far (``None`` if it has none).

        Examples:
            >>> import numpy as np
            >>> from ember.data import ArrayDataset, DevicePrefetch
            >>> it = iter(DevicePrefetch(ArrayDataset(np.arange(8), batch_size=2), put=lambda b: b, size=2))
            >>> _ = next(it)
            >>> it.get_state()["position"]
            1
        """
        if self._positions is None:
            return None
        if self._state is not None:
            return self._state
        return self._it.get_state()  # type: ignore[attr-defined]  # nothing read ahead: the source's own

    def set_state(self, state: Any) -> None:
        """Continue from a position `get_state` gave; batches read ahead are dropped."""
        self._queue.clear()
        restore(self._it, state)
        self._state = None

    def close(self) -> None:
        """Drop the batches read ahead and close the source's iterator (Grain's workers stop)."""
        self._queue.clear()
        close(self._it)
