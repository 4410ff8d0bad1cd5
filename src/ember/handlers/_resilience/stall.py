"""`StallWatchdog`: a run that stops making progress writes a diagnosis and exits for a requeue, instead of hanging."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ember.engine import Engine, Events, RemovableEventHandle, collect_handles
from ember.handlers._checkpointing.checkpoint import Checkpoint, checkpoints_given
from ember.handlers._resilience.watch import Watch
from ember.handlers._resilience.watchdog import EXIT_CODE


def _seconds(name: str, value: object, *, optional: bool = False) -> float:
    """``value`` as seconds (``inf`` for an optional ``None``); a ``ValueError`` naming ``name`` otherwise."""
    if value is None and optional:
        return float("inf")
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        what = "a positive number of seconds" + (" or None" if optional else "")
        raise ValueError(f"`{name}` must be {what}, got {value!r}.")
    return float(value)


def running_handler(thread_id: int | None) -> str:
    """The handler the engine's thread ``thread_id`` is running now, read from its stack (nothing on the hot path).

    The innermost call made from an engine's dispatch is the handler: its qualified name, file and line. Outside
    any handler: what the thread is in (the step, the data), by the innermost engine frame.
    """
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None  # a diagnosis
    callee = None
    while frame is not None:
        code = frame.f_code
        if code.co_name == "fire" and code.co_filename.endswith(os.path.join("engine", "_dispatch.py")):
            if callee is None:
                return "an engine's event dispatch"
            return f"{callee.f_code.co_qualname} ({callee.f_code.co_filename}:{callee.f_lineno})"
        if code.co_name == "_run_epoch" and code.co_filename.endswith(os.path.join("engine", "_loop.py")):
            return "no handler: the process function (the step) or the data"
        callee, frame = frame, frame.f_back
    return "no handler: the engine is not running on that thread"


def _in_a_save(thread_id: int | None) -> bool:
    """Whether the thread ``thread_id`` is inside a checkpoint's save or its wait for one (read from its stack)."""
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    while frame is not None:
        path = frame.f_code.co_filename
        if any(os.path.join("ember", *room, "") in path for room in _SAVING_ROOMS):
            return True
        frame = frame.f_back
    return False


_SAVING_ROOMS = (("checkpoint",), ("handlers", "_checkpointing"))  # the stores, and the handler's saving


class StallWatchdog:
    """Ends a stalled process with a diagnosis on disk and exit status 75, so a scheduler requeues it.

    A thread watches the trainer (and the evaluators and checkpoints given to `attach`). When no iteration
    completes within ``step_timeout`` seconds (``startup_timeout`` before the first one: compilation, the first
    batch), or a checkpoint's background write has not finished within ``save_timeout``, the process writes
    every thread's Python stack (``faulthandler``) and the engine's state (the last event, the iteration and epoch,
    the handler running, read from the training thread's stack) to ``stall-process<i>.txt`` in ``run_dir`` and to
    stderr, then exits with status 75 (EX_TEMPFAIL): a relaunch resumes from the last checkpoint.

    An iteration of an evaluator counts as progress, so a long evaluation is not a stall; an evaluator's first
    iteration (which compiles its step) gets ``startup_timeout``. A run paused by ``interrupt()`` is not watched
    until it goes on. With several processes each process watches itself and names itself; a peer stuck behind
    the stalled one in a collective stalls too, and writes its own diagnosis.

    Args:
        run_dir: the folder the diagnosis is written to (made if missing).
        step_timeout: seconds an iteration (or an evaluation's iteration) may take.
        startup_timeout: seconds until the first iteration completes (compilation included).
        save_timeout: seconds a checkpoint write may take, from its start; ``None``: as long as it takes. A wait of
            the training thread for a write (the run's last save) counts against it, never against ``step_timeout``.
        exit: how the process ends (``os._exit``: the runtime's shutdown would wait on a stuck collective); tests
            pass their own.

    Examples:
        >>> import tempfile
        >>> from ember import Engine
        >>> from ember.handlers import StallWatchdog
        >>> engine = Engine(lambda e, b: b)
        >>> watchdog = StallWatchdog(tempfile.mkdtemp(), step_timeout=60, startup_timeout=600)
        >>> _ = watchdog.attach(engine)
        >>> engine.run([1, 2, 3]).iteration, watchdog.stalled
        (3, None)
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        step_timeout: float = 600.0,
        startup_timeout: float = 1800.0,
        save_timeout: float | None = None,
        exit: Callable[[int], Any] = os._exit,
    ) -> None:
        if not isinstance(run_dir, str | os.PathLike):
            raise TypeError(f"`run_dir` must be a folder path, got {type(run_dir).__name__}.")
        self.run_dir = Path(run_dir).resolve()
        self.step_timeout = _seconds("step_timeout", step_timeout)
        self.startup_timeout = _seconds("startup_timeout", startup_timeout)
        self.save_timeout = _seconds("save_timeout", save_timeout, optional=True)
        self._exit = exit
        self.stalled: str | None = None  # what the diagnosis said, once written
        self._engine: Engine | None = None
        self._checkpoints: list[Checkpoint] = []
        self._thread_id: int | None = None
        self._deadline, self._waiting_for = float("inf"), ""  # when the next progress is due, and what it is
        self._paused = False
        self._seen: set[int] = set()  # the evaluators that have compiled their step (run an iteration)
        self._writing_since: dict[int, float] = {}
        poll = min(1.0, max(0.05, min(self.step_timeout, self.startup_timeout, self.save_timeout) / 10))
        self.watch = Watch("ember-stall-watchdog", poll, self._check)

    # -- progress, from the engines' handlers ------------------------------------------------------

    def _expect(self, what: str, limit: float, name: str) -> None:
        self._deadline, self._waiting_for, self._paused = time.monotonic() + limit, f"{what} ({name}={limit:g})", False

    def _started(self, engine: Engine) -> None:
        self._thread_id = threading.get_ident()
        self._expect("first iteration", self.startup_timeout, "startup_timeout")
        self.watch.start()

    def _iteration(self, engine: Engine) -> None:
        self._seen.add(id(engine))
        self._expect("iteration", self.step_timeout, "step_timeout")

    def _evaluation_started(self, engine: Engine) -> None:
        if id(engine) in self._seen:
            self._expect("evaluation iteration", self.step_timeout, "step_timeout")
        else:  # its first iteration compiles the eval step
            self._expect("first evaluation iteration", self.startup_timeout, "startup_timeout")

    def _interrupted(self) -> None:
        self._paused = True  # interrupt() returned to the caller: nothing is due until the run goes on

    def _terminated(self, engine: Engine) -> None:
        if engine.should_terminate == "skip_completed":
            self.watch.stop()

    def _finished(self) -> None:
        self.watch.stop()

    # -- the watching thread ------------------------------------------------------------------------

    def _late(self, now: float) -> str | None:
        """Why the run counts as stalled at ``now`` (monotonic), or ``None``.

        A checkpoint write is bounded by ``save_timeout`` from its start; while the training thread waits for one
        (the save of the run's end, a save waiting for the one before), that time is the save's, not the step's.
        """
        for i, checkpoint in enumerate(self._checkpoints):
            store = checkpoint.store
            writing = store is not None and store.busy  # a write in progress, not one finished and not yet waited for
            since = self._writing_since.setdefault(i, now) if writing else self._writing_since.pop(i, None)
            if since is not None and now - since > self.save_timeout:
                return (
                    f"no checkpoint write finished in {now - since:.1f} s (save_timeout={self.save_timeout:g}), "
                    f"in {store.root if store is not None else 'its store'}"
                )
        if self._paused or now <= self._deadline:
            return None
        if self._writing_since and _in_a_save(self._thread_id):
            return None  # the training thread waits for a write: save_timeout's to bound
        return f"no {self._waiting_for} completed in time"

    def _check(self) -> bool:
        """On the watch's thread: diagnose and end the run if it is late; whether it did."""
        why = self._late(time.monotonic())
        if why is None or self.watch.stopped:
            return False
        self._diagnose(why)
        return True

    def _header(self, why: str) -> str:
        import jax

        engine = self._engine
        index, count = jax.process_index(), jax.process_count()
        where = ""
        if engine is not None:
            st = engine.state
            where = (
                f"\nthe engine: last event {engine.last_event_name}, iteration {st.iteration}, epoch {st.epoch}; "
                f"running {running_handler(self._thread_id)}"
            )
        return (
            f"ember: StallWatchdog: {why}. Process {index} of {count} (pid {os.getpid()}) stops here with exit "
            f"status {EXIT_CODE}; relaunch to resume from the last checkpoint.{where}\n"
            f"Every thread's Python stack, most recent call first:\n"
        )

    def _diagnose(self, why: str) -> None:
        import jax

        header = self._header(why)
        self.stalled = header
        path = self.run_dir / f"stall-process{jax.process_index()}.txt"
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with open(path, "w") as f:
                f.write(header)
                f.flush()
                faulthandler.dump_traceback(f, all_threads=True)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            header += f"(the diagnosis could not be written to {path}: {e})\n"
        sys.stderr.write(header)
        sys.stderr.flush()
        faulthandler.dump_traceback(sys.stderr, all_threads=True)
        sys.stderr.write(f"(also in {path})\n")
        sys.stderr.flush()
        sys.stdout.flush()
        self._exit(EXIT_CODE)

    def attach(
        self, trainer: Engine, evaluators: Sequence[Engine] = (), checkpoints: Sequence[Checkpoint] = ()
    ) -> RemovableEventHandle:
        """Watch ``trainer`` from its STARTED to its COMPLETED (or an exception); evaluators' iterations count too.

        ``checkpoints``: whose background writes ``save_timeout`` bounds.

        Examples:
            >>> import tempfile
            >>> from ember import Engine
            >>> from ember.handlers import StallWatchdog
            >>> handle = StallWatchdog(tempfile.mkdtemp()).attach(Engine(lambda e, b: b))
        """
        self._engine, self._checkpoints = trainer, checkpoints_given(checkpoints)
        with collect_handles() as made:
            trainer.add_event_handler(Events.STARTED, self._started)
            trainer.add_event_handler(Events.ITERATION_COMPLETED, self._iteration)
            trainer.add_event_handler(Events.INTERRUPT, self._interrupted)
            trainer.add_event_handler(Events.TERMINATE, self._terminated)
            trainer.add_event_handler(Events.COMPLETED, self._finished)
            trainer.add_event_handler(Events.EXCEPTION_RAISED, lambda engine, error: self._finished())
            for evaluator in evaluators:
                evaluator.add_event_handler(Events.STARTED, self._evaluation_started)
                evaluator.add_event_handler(Events.ITERATION_COMPLETED, self._iteration)
        return made.handle
