"""Ctrl-C and SIGTERM before training starts: noted while JAX imports and the run is built, honoured at safe points.

A ``KeyboardInterrupt`` raised wherever the signal lands (inside an import, or a callback JAX runs during garbage
collection, where Python only prints "Exception ignored") can abort the process or be lost, and the run then trains
to its end. So ``ember train`` notes the signal instead (`noting_signals`) and stops at the next safe point
(`stop_if_signalled`), with one line and the resumable status (130, 143). Once training runs, ``Preemption`` takes
the signals over (it saves, then stops), and one noted after the last safe point is handed to it (`hand_over`). A
second Ctrl-C while the first waits stops at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Generator
from typing import Any

_noted: list[int] = []


class StoppedBeforeTraining(KeyboardInterrupt):
    """A Ctrl-C or SIGTERM noted before training started: the run stops with ``128 + signum``.

    Examples:
        >>> import signal
        >>> from ember.cli._early_signals import StoppedBeforeTraining
        >>> StoppedBeforeTraining(signal.SIGTERM).status
        143
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.status = 128 + signum
        self.words = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


@contextlib.contextmanager
def noting_signals() -> Generator[None]:
    """Within it, Ctrl-C and SIGTERM are noted (a second Ctrl-C still interrupts at once); the handlers are put back.

    Only in the main thread (elsewhere it changes nothing).

    Examples:
        >>> from ember.cli._early_signals import noting_signals, stop_if_signalled
        >>> with noting_signals():
        ...     stop_if_signalled()  # nothing noted: nothing happens
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def note(signum: int, _frame: Any) -> None:
        if signum == signal.SIGINT and signal.SIGINT in _noted:
            raise KeyboardInterrupt  # pressed twice: now
        _noted.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _noted.clear()


def stop_if_signalled() -> None:
    """Raise `StoppedBeforeTraining` if a Ctrl-C or SIGTERM was noted (and forget it): a safe point to stop at."""
    if _noted:
        signum = _noted[0]
        _noted.clear()
        raise StoppedBeforeTraining(signum)


def hand_over(preemption: Any, trainer: Any) -> None:
    """At ``trainer``'s STARTED, once ``preemption`` catches the signals: one noted since the last safe point is its.

    ``preemption`` then saves and stops before the first batch, as for a signal of its own.

    Examples:
        >>> import tempfile
        >>> from ember import Engine
        >>> from ember.cli._early_signals import hand_over
        >>> from ember.handlers import Checkpoint, Preemption
        >>> trainer = Engine(lambda e, b: b)
        >>> preemption = Preemption(Checkpoint({"trainer": trainer}, tempfile.mkdtemp()))
        >>> _ = preemption.attach(trainer)
        >>> hand_over(preemption, trainer)
        >>> _noted.append(signal.SIGTERM)  # as a SIGTERM between the last safe point and the run's start
        >>> trainer.run([1, 2]).iteration, preemption.saved.step, preemption.requested == signal.SIGTERM
        (0, 0, True)
    """
    from ember.engine import Events  # here: this module is imported before JAX, whose import it guards

    def take(_: Any) -> None:
        if _noted and preemption.requested is None:
            preemption.requested = _noted[0]
        _noted.clear()

    trainer.add_priority_handler(Events.STARTED, take)  # after Preemption's own (attached first), before the rest
