"""`Watch`: a daemon thread that checks on a run every few seconds and acts once (what the watchdogs hold)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Watch:
    """Calls ``check()`` every ``every`` seconds on a daemon thread, from ``start()`` until ``stop()``.

    ``check`` returns ``True`` when it has acted (ended the process, written a diagnosis): the watch ends there.
    ``start()`` while the thread is alive does nothing, so a second ``run()`` of the engine keeps one watch; a
    stopped watch starts again. `StallWatchdog` and `ProcessWatchdog` each hold one.

    Examples:
        >>> from ember.handlers._resilience.watch import Watch
        >>> seen = []
        >>> watch = Watch("example", 0.01, lambda: seen.append(1) or len(seen) == 3)
        >>> watch.start(); watch.join(timeout=5), len(seen)
        (True, 3)
    """

    def __init__(self, name: str, every: float, check: Callable[[], bool]) -> None:
        self.name, self.every, self.check = name, every, check
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            if self.check():
                return

    def start(self) -> None:
        """Start watching (nothing if the thread is alive)."""
        if self.thread is not None and self.thread.is_alive():
            return
        self._stop.clear()
        self.thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """End the watch at its next wake-up (the thread is not joined: a check may be ending the process)."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        """Whether ``stop()`` was called since the last ``start()``."""
        return self._stop.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, woken by ``stop()``; whether it was stopped."""
        return self._stop.wait(seconds)

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the thread to end; whether it has (a watch never started has)."""
        if self.thread is not None:
            self.thread.join(timeout)
        return self.thread is None or not self.thread.is_alive()
