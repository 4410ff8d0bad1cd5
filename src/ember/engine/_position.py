"""`DataPosition`: where an engine stands in its data, owned in one place."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ember._protocols import position, release, reopen
from ember.engine._validate import length_of


class DataPosition:
    """The data as given, the live iterator over it, and a position that is not live.

    A position is not live when it was loaded from a checkpoint, or kept when a run released its iterator (an
    iterator with a position is closed when a run stops, so Grain's workers stop too, and reopened there when the
    run goes on). The engine's loop reads ``live`` for every batch; everything else goes through the methods.

    Examples:
        >>> from ember.engine._position import DataPosition
        >>> where = DataPosition()
        >>> where.start("abc", "abc")
        >>> next(where.live), where.saved()  # a string's iterator has no position of its own
        ('a', None)
        >>> where.release(); next(where.live)  # so it stays live, and a continued run takes its next batch
        'b'
        >>> where.load({"position": 2}); where.live is None, where.saved()  # a loaded position waits for open()
        (True, {'position': 2})
    """

    __slots__ = ("live", "pending", "released", "source")

    def __init__(self) -> None:
        self.source: Iterable[Any] | None = None  # the data as given (an engine's state.dataloader may wrap it)
        self.live: Iterator[Any] | None = None  # the iterator batches come from
        self.pending: Any = None  # a position not live, applied when the next iterator opens
        self.released = False  # ``pending`` is where a live iterator stood when its run stopped

    def start(self, source: Iterable[Any] | None, loader: Iterable[Any] | None = None) -> None:
        """New data: ``source`` as given; with ``loader`` (what the engine iterates), an iterator open at its start."""
        self.source = source
        self.live = None if loader is None else iter(loader)
        self.pending, self.released = None, False

    def load(self, pending: Any) -> None:
        """Take a position loaded from a checkpoint; the next iterator opens there."""
        self.live, self.pending, self.released = None, pending, False

    def saved(self) -> Any:
        """The position a checkpoint records: the one not live, else the live iterator's (``None``: none)."""
        return self.pending if self.pending is not None else position(self.live)

    def fresh_pass(self, loader: Iterable[Any], iteration: int) -> Iterator[Any]:
        """A new pass over ``loader``; data with ``set_epoch`` learns which pass, counted from ``iteration``.

        The pass is the number of whole passes over the data before the next batch, so the order an
        engine sees (a shuffle seeded per pass) depends on its own counters alone, not on other engines
        iterating the same data (an evaluator run over the training set) nor on how the run was resumed.
        """
        set_epoch = getattr(self.source, "set_epoch", None)
        if callable(set_epoch):
            length = length_of(self.source)
            if length:
                set_epoch(iteration // length)
        self.live = iter(loader)
        return self.live

    def open(self, loader: Iterable[Any], *, iteration: int, epoch: int, epoch_pos: int) -> Iterator[Any]:
        """A live iterator positioned where the engine stands: the pending position, else skipped through."""
        if self.pending is not None:
            state, self.pending, self.released = self.pending, None, False
            self.live = reopen(loader, state)
            return self.live
        it = self.fresh_pass(loader, iteration)
        # data that has no position of its own is skipped through, to where the pass stands: an
        # iterator runs on across epochs when they are shorter than the data
        length = length_of(loader)
        for skipped in range(iteration % length if length else epoch_pos):
            try:
                next(it)
            except StopIteration:
                raise ValueError(
                    f"Cannot resume at iteration {epoch_pos} of epoch {epoch}: the data ran out after {skipped} "
                    "batches. Pass the same data the run was started with."
                ) from None
        return it

    def release(self, *, failed: bool = False) -> None:
        """Close the live iterator if it has a position, kept for the next open (its workers stop here).

        An iterator without a position stays live, so a continued run takes its next batch, unless the run
        ``failed``: then it is dropped, as it may be broken, and a continued run skips through fresh data.
        """
        try:
            state = release(self.live)
        except Exception:
            if not failed:
                raise
            state = None  # the failure may have come from the data itself
        if state is not None:
            self.pending, self.released = state, True
        if state is not None or failed:
            self.live = None
