"""`DevicePrefetch`: put batches on device ahead of the step that needs them."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any


class DevicePrefetch:
    """Wraps an iterable of host batches; keeps ``size`` batches already transferred ahead.

    ``put`` starts each transfer (``jax.device_put`` is asynchronous), so batch n+1 and n+2 travel while
    step n runs. When the source saves its position (``state_dict``/``load_state_dict``), this wrapper
    reports the position of the batches it handed out, not of those it read ahead, so resuming is exact.

    Args:
        source: any re-iterable of batches (a list, an :class:`ArrayDataset`, a loader).
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
        self._position: Any = None

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]  # raises TypeError for unsized sources, as len() should

    def _tracks_position(self) -> bool:
        return callable(getattr(self.source, "state_dict", None)) and callable(
            getattr(self.source, "load_state_dict", None)
        )

    def __iter__(self) -> Iterator[Any]:
        tracks = self._tracks_position()
        it = iter(self.source)
        # the position after each batch: the iterator's own where it has one (another consumer of the same
        # source moves the source's), else the source's
        position = getattr(it, "state_dict", None) if tracks else None
        if tracks and not callable(position):
            position = self.source.state_dict  # type: ignore[attr-defined]
        if position is not None:
            self._position = position()
        return self._prefetched(it, position)

    def _prefetched(self, it: Iterator[Any], position: Callable[[], Any] | None) -> Iterator[Any]:
        queue: collections.deque[tuple[Any, Any]] = collections.deque()
        if self.decide is not None:
            try:
                first = next(it)
            except StopIteration:
                return
            self.size = self.decide(first)
            it = itertools.chain([first], it)  # the source's position after it is still the right one for it

        def fill(n: int) -> None:
            while len(queue) < n:
                try:
                    batch = next(it)
                except StopIteration:
                    return
                queue.append((self.put(batch), position() if position is not None else None))

        while True:
            fill(max(self.size, 1))  # at least the batch to hand out now
            if not queue:
                return
            batch, after = queue.popleft()
            fill(self.size)  # and `size` more already travelling
            if position is not None:
                self._position = after
            yield batch

    def state_dict(self) -> Any:
        """The source's position after the batches handed out so far (``None`` if it has none).

        Examples:
            >>> import numpy as np
            >>> from ember.data import ArrayDataset, DevicePrefetch
            >>> data = DevicePrefetch(ArrayDataset(np.arange(8), batch_size=2), put=lambda b: b, size=2)
            >>> it = iter(data); _ = next(it)
            >>> data.state_dict(), data.source.state_dict()
            ({'epoch': 0, 'position': 1}, {'epoch': 0, 'position': 3})
        """
        if not self._tracks_position():
            return None
        return self._position if self._position is not None else self.source.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state_dict: Any) -> None:
        """Restore the source's position; the next ``iter()`` continues from it."""
        self.source.load_state_dict(state_dict)  # type: ignore[attr-defined]
        self._position = state_dict
