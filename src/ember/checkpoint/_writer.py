"""`WriterThread`: a store's one background thread; its writes run in order, and their errors reach the caller."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from pathlib import Path

from ember.checkpoint._format import lower_thread_priority
from ember.checkpoint._info import CheckpointInfo


class WriterThread:
    """One thread (started at the first task, at a lower priority than training) and the newest task's future.

    ``pending`` is the newest task not yet waited for: [`wait`][ember.checkpoint.CheckpointStore.wait] takes it (and
    raises its error), as does the next save.
    """

    def __init__(self, root: Path) -> None:
        self.root = root  # named in a timeout's message
        self._pool: ThreadPoolExecutor | None = None
        self.pending: Future[CheckpointInfo] | None = None
        _LIVE.add(self)

    def submit(self, task: Callable[[], CheckpointInfo], then: Callable[[], object] | None) -> Future[CheckpointInfo]:
        """Run ``task()`` then ``then()`` on the thread, after every task before it; it becomes ``pending``."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="ember-checkpoint", initializer=lower_thread_priority
            )
        self.pending = self._pool.submit(then_after, task, then)
        return self.pending

    @property
    def busy(self) -> bool:
        """Whether a task is running or queued now (the pending one has not finished)."""
        pending = self.pending
        return pending is not None and not pending.done()

    def wait(self, timeout: float | None = None) -> CheckpointInfo | None:
        """The pending task's info once it is done (``None`` if there is none); its error re-raised."""
        pending = self.pending
        if pending is None:
            return None
        try:
            info = pending.result(timeout)
        except TimeoutError:
            raise TimeoutError(
                f"The checkpoint being written into {self.root} was not done within {timeout} s."
            ) from None
        finally:
            if pending.done():
                self.pending = None
        return info

    def raise_if_failed(self) -> None:
        """Re-raise the error of a pending task that has already failed; never blocks."""
        pending = self.pending
        if pending is not None and pending.done() and pending.exception() is not None:
            self.pending = None
            # the ignore below: done() was true, so exception() is the raised error or None (checked above)
            raise pending.exception()  # type: ignore[misc]

    def close(self) -> None:
        """Wait for the pending task (raising its error), and stop the thread; a later task starts another."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None


_LIVE: weakref.WeakSet[WriterThread] = weakref.WeakSet()  # every writer of this process, for `settle_writes_into`


def settle_writes_into(path: Path) -> None:
    """Wait until no write of this process is in flight into ``path`` or into its parent folder (its checkpoint).

    The writes' errors stay with their stores (their owners raise them); a reader only waits for the files.
    """
    here = path.resolve()
    for writer in list(_LIVE):
        pending = writer.pending
        if pending is not None and writer.root.resolve() in (here, here.parent):
            wait_for([pending])


def then_after(task: Callable[[], CheckpointInfo], then: Callable[[], object] | None) -> CheckpointInfo:
    """``task()``, then ``then()``: one background task, so a failure of either is the task's."""
    info = task()
    if then is not None:
        then()
    return info
