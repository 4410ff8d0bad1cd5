"""`Signals`: what handlers asked the run loop to do, acted on once the current event's handlers have run."""

from __future__ import annotations


class Signals:
    """The requests a run is under: terminate, terminate the epoch, interrupt, pause; ``any`` folds them.

    Handlers set them (through the engine's ``terminate()``, ``terminate_epoch()``, ``interrupt()`` and an
    ``iterate()`` pause); the loop tests ``any`` once after each event, and acts only when it is set.

    Attributes:
        terminate: ``False``, ``True``, or ``"skip_completed"`` (COMPLETED is not fired).
        final: whether the terminate in effect ends the run for a relaunch too (``False``: a preemption's stop, or
            the end of ``max_iters``).
        terminate_epoch: end the current epoch.
        skip_epoch_completed: with ``terminate_epoch``: do not fire that epoch's EPOCH_COMPLETED.
        interrupt: return from ``run()``; the next ``run()`` resumes.
        pause: hand the state to ``iterate()``'s caller.
        any: whether any of them is set.

    Examples:
        >>> from ember.engine._signals import Signals
        >>> signals = Signals()
        >>> signals.any
        False
        >>> signals.set_terminate(True, final=False); signals.any, signals.ended_by_decision
        (True, False)
        >>> signals.clear(); signals.any
        False
    """

    __slots__ = ("any", "final", "interrupt", "pause", "skip_epoch_completed", "terminate", "terminate_epoch")

    def __init__(self) -> None:
        self.terminate: bool | str = False
        self.final = True
        self.terminate_epoch = False
        self.skip_epoch_completed = False
        self.interrupt = False
        self.pause = False
        self.any = False

    def clear(self) -> None:
        """No request: a run starts."""
        self.terminate, self.final = False, True
        self.terminate_epoch = self.skip_epoch_completed = False
        self.interrupt = self.pause = self.any = False

    def update(self) -> None:
        """Fold the requests into ``any`` (after one of them changed)."""
        self.any = bool(self.terminate or self.terminate_epoch or self.interrupt or self.pause)

    def set_terminate(self, value: bool | str, *, final: bool = True) -> None:
        """Ask the run to stop (``value``: ``True`` or ``"skip_completed"``; ``False`` withdraws it)."""
        self.terminate, self.final = value, bool(final)
        self.update()

    def set_terminate_epoch(self, value: bool | str) -> None:
        """Ask the epoch to end (``value``: ``True`` or ``"skip_epoch_completed"``; ``False`` withdraws it)."""
        self.terminate_epoch = bool(value)
        self.skip_epoch_completed = value == "skip_epoch_completed"
        self.update()

    def end_epoch_request(self) -> bool:
        """The epoch's end was acted on: clear the request; return whether EPOCH_COMPLETED is to be skipped."""
        skip = self.skip_epoch_completed
        self.terminate_epoch = self.skip_epoch_completed = False
        self.update()
        return skip

    def set_interrupt(self, value: bool) -> None:
        """Ask ``run()`` to return (``False``: acted on)."""
        self.interrupt = value
        self.update()

    def set_pause(self, value: bool) -> None:
        """Ask the run to hand its state to ``iterate()``'s caller (``False``: acted on)."""
        self.pause = value
        self.update()

    @property
    def epoch_request(self) -> bool | str:
        """``terminate_epoch`` as ``should_terminate_single_epoch`` reads it (``"skip_epoch_completed"``: skipping)."""
        return "skip_epoch_completed" if self.skip_epoch_completed else self.terminate_epoch

    @property
    def ended_by_decision(self) -> bool:
        """The run was stopped by a final ``terminate()``: a run loaded from its state is complete."""
        return bool(self.terminate) and self.final
