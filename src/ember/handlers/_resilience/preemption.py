"""`Preemption`: on SIGTERM, checkpoint at the next iteration boundary and end the run cleanly."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from ember.checkpoint import CheckpointInfo
from ember.engine import Engine, Events, RemovableEventHandle, collect_handles
from ember.handlers._checkpointing.checkpoint import Checkpoint
from ember.handlers._resilience.agreement import any_process, check_interval, positive_or_none

log = logging.getLogger("ember")


class Preemption:
    """Turns a termination signal into a checkpoint and a clean exit, for preemptible machines.

    The signal handler only sets a flag. At the trainer's next ITERATION_COMPLETED the ``checkpoint``
    handler saves synchronously (the checkpoint is on disk before anything else happens) and the trainer
    terminates; COMPLETED fires, so writers flush and ``run()`` returns normally. If the signal arrives
    while an evaluator in ``evaluators`` is running inside the trainer (from an EPOCH_COMPLETED handler),
    the evaluator stops at its next iteration without firing COMPLETED (so no handler acts on a partial
    evaluation), and the trainer saves and stops right after it; the checkpoint records that epoch's
    EPOCH_COMPLETED as still owed, so the resumed run evaluates that epoch again, whole, and everything
    continues exactly. A signal that arrives before the first iteration of a run (during a STARTED handler: the
    evaluation a resumed run makes up first) is acted on before the first batch is read: nothing is trained, and
    the checkpoint is the run's position, the evaluation still owed. `saved` holds the checkpoint taken.
    The previous signal handlers come back when the run ends. In a multi-process run the processes agree
    (a small collective): a signal delivered to any one process makes all of them save and stop at the
    same iteration. They agree every ``check_every`` iterations (10 by default; a single process looks at
    its flag every iteration, which costs nothing) and at every EPOCH_COMPLETED, so a run on many hosts
    does not pay a collective per step; the save comes at most ``check_every - 1`` iterations later.

    Args:
        checkpoint: the [`Checkpoint`][ember.handlers.Checkpoint] handler whose ``to_save`` and store are used.
        signals: the signals to catch (``SIGTERM`` by default; add ``SIGINT`` for Ctrl-C).
        check_every: look for a signal at the iterations that are multiples of it (the trainer's, and an
            evaluator's own); ``None``: 1 in a single process, 10 with several.

    Examples:
        >>> import os, signal, tempfile
        >>> from ember import Engine, Events
        >>> from ember.handlers import Checkpoint, Preemption
        >>> trainer = Engine(lambda e, b: b)
        >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp())
        >>> preemption = Preemption(saver)
        >>> _ = preemption.attach(trainer)
        >>> def preempt():
        ...     os.kill(os.getpid(), signal.SIGTERM)  # as a cluster scheduler would
        >>> _ = trainer.add_event_handler(Events.ITERATION_COMPLETED(once=3), preempt)
        >>> trainer.run(range(10)).iteration, preemption.saved.step  # saved at the next iteration boundary
        (4, 4)
    """

    def __init__(
        self, checkpoint: Checkpoint, signals: Sequence[int] = (signal.SIGTERM,), *, check_every: int | None = None
    ) -> None:
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"`checkpoint` must be an ember.handlers.Checkpoint, got {type(checkpoint).__name__}.")
        if checkpoint.store is None:
            raise TypeError(
                "`checkpoint` must write into one of ember's stores (a folder, a CheckpointStore, a DiskSaver): "
                "Preemption waits until the checkpoint is committed before the run stops, which a save_handler of "
                "your own cannot tell it."
            )
        if isinstance(signals, int) or not signals:
            raise TypeError(f"`signals` must be a non-empty sequence of signal numbers, got {signals!r}.")
        self.checkpoint, self.signals = checkpoint, tuple(signals)
        self.check_every = positive_or_none("check_every", check_every)
        self._interval = 1
        self.requested: int | None = None
        self.saved: CheckpointInfo | None = None
        self._cut_short = False  # an evaluation was stopped early by the signal
        self._previous: dict[int, Any] = {}
        self._first: RemovableEventHandle | None = None  # the boundary before the run's first batch

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.requested = signum

    def _install(self, trainer: Engine) -> None:
        """First at the trainer's STARTED: catch the signals, and look for one before the first batch is read."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("Preemption catches signals, which Python only delivers to the main thread.")
        self.requested, self.saved, self._cut_short = None, None, False
        self._interval = check_interval(self.check_every)
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._on_signal)
        self._first = trainer.add_event_handler(Events.GET_BATCH_STARTED, self._before_first_batch)

    def _before_first_batch(self, trainer: Engine) -> None:
        """Once per run, after every STARTED handler (an evaluation made up): a signal then stops the run untrained."""
        self._drop_first()
        self._stop_if_requested(trainer)

    def _drop_first(self) -> None:
        if self._first is not None:
            self._first.remove()
            self._first = None

    def _restore(self, *_: Any) -> None:
        self._drop_first()
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        self._previous.clear()

    def _due(self, engine: Engine) -> bool:
        """Whether this boundary is one where the processes agree: an epoch's end, or a multiple of the interval."""
        return engine.last_event_name is Events.EPOCH_COMPLETED or engine.state.iteration % self._interval == 0

    def _trainer_boundary(self, trainer: Engine) -> None:
        if self._due(trainer):
            self._stop_if_requested(trainer)

    def _stop_if_requested(self, trainer: Engine) -> None:
        if self.saved is None and any_process(self.requested is not None):  # all processes save and stop together
            if self._cut_short and trainer.last_event_name is Events.EPOCH_COMPLETED:
                trainer.mark_epoch_incomplete()  # the resumed run fires it again: the evaluation runs whole
            self.saved = self.checkpoint.save_now(trainer)
            log.info(  # the run's own caller says it stopped (ember train's closing line); logging says it at INFO
                "Signal %s: saved %s at iteration %d; stopping.",
                self.requested if self.requested is not None else "on another process",
                self.saved.path.name,
                trainer.state.iteration,
            )
            trainer.terminate(final=False)  # a relaunch trains on from the checkpoint just saved

    def _evaluator_boundary(self, evaluator: Engine) -> None:
        if self._due(evaluator) and any_process(self.requested is not None):  # all evaluators stop at one batch
            self._cut_short = True
            evaluator.terminate(skip_completed=True)

    def attach(self, trainer: Engine, evaluators: Sequence[Engine] = ()) -> RemovableEventHandle:
        """Catch the signals during ``trainer``'s runs; stop ``evaluators`` early when one arrives.

        Returns the handle of the registration that installs the signal handlers at STARTED: removed, later runs
        catch no signal (the boundary handlers left behind then never act).

        Examples:
            >>> import tempfile
            >>> from ember import Engine
            >>> from ember.handlers import Checkpoint, Preemption
            >>> trainer, evaluator = Engine(lambda e, b: b), Engine(lambda e, b: b)
            >>> handle = Preemption(Checkpoint({"trainer": trainer}, tempfile.mkdtemp())).attach(trainer, [evaluator])
            >>> handle.remove(); trainer.run([1]).iteration
            1
        """
        with collect_handles() as made:
            trainer.add_priority_handler(Events.STARTED, self._install)  # before an evaluation made up at STARTED
            trainer.add_event_handler(Events.ITERATION_COMPLETED | Events.EPOCH_COMPLETED, self._trainer_boundary)
            trainer.add_event_handler(Events.COMPLETED | Events.EXCEPTION_RAISED, self._restore)
            for evaluator in evaluators:
                evaluator.add_event_handler(Events.ITERATION_COMPLETED, self._evaluator_boundary)
        return made.handle
