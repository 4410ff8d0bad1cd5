"""`ProcessWatchdog`: a multi-process run whose peer is lost ends at once, saying which and where to resume."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Generator
from typing import Any

from ember._multiprocess import REQUEUE_STATUS, coordination_client
from ember.engine import Engine, Events, RemovableEventHandle, collect_handles
from ember.errors import ProcessesMissing
from ember.handlers._checkpointing.checkpoint import Checkpoint
from ember.handlers._resilience.watch import Watch

#: The exit status of a process the watchdog ends: EX_TEMPFAIL, "try again" (relaunch every process).
EXIT_CODE = REQUEUE_STATUS

#: Seconds the watchdog gives a checkpoint still being written to land on disk before it names the newest one there.
SAVE_GRACE = 10.0

_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "heartbeat", "UNAVAILABLE")


class ProcessWatchdog:
    """Ends this process with a clear message when another process of a multi-process run is lost.

    When a process dies (SIGKILL, a lost machine), the others block in the next collective or fail in it,
    and JAX's runtime aborts them later with a message that names no process. With the watchdog attached,
    a survivor ends instead by printing which process was lost and the newest checkpoint committed in the
    checkpoint's folder (a background save still being written gets ``SAVE_GRACE`` seconds to land first), and exits
    with status 75 (EX_TEMPFAIL): relaunch every process and the run resumes from that checkpoint.

    It learns of the loss in one of two ways, whichever comes first:

    - a collective fails because a peer's connection closed (XLA:CPU's Gloo does this at once): at the
      trainer's EXCEPTION_RAISED;
    - a wait where the processes meet outside the compiled step (a checkpoint's commit) runs out
      (`ProcessesMissing`, after ``EMBER_WAIT_TIMEOUT`` seconds): at EXCEPTION_RAISED, naming the processes that
      did not arrive;
    - a thread asks JAX's coordination service every ``poll_every`` seconds which processes are alive;
      the service declares a process lost after ``heartbeat_timeout_seconds`` (an argument of
      ``jax.distributed.initialize``; 100 s by default). This path needs
      ``jax.config.update("jax_enable_recoverability", True)`` before ``jax.distributed.initialize``;
      without it the runtime aborts every survivor at that moment, before anything else can act.

    So a survivor ends within about ``heartbeat_timeout_seconds + poll_every`` seconds, or at once when a
    collective fails; a process that stalls (SIGSTOP, swapped out) stops its heartbeats and is named the same way.
    Process 0 hosts the coordination service: when it is killed, a question to the service fails at once; when it
    stalls, a question hangs, and a service that has not answered a lookup (a second thread asks every
    ``poll_every`` seconds) within ``answer_within`` seconds names process 0
    (the runtime would end the survivors with its own message, naming no process, once their heartbeats to the
    service time out: keep ``answer_within`` well below ``heartbeat_timeout_seconds``). In a single-process run the
    watchdog does nothing.

    Args:
        checkpoint: the [`Checkpoint`][ember.handlers.Checkpoint] whose last complete checkpoint the message names;
            ``None`` for a job that keeps its own state (the message says a relaunch resumes from what it recorded).
        poll_every: seconds between two questions to the coordination service.
        confirm_within: after a failed collective, how long to wait (with recoverability on) for the
            service to say which process was lost; the message says "another process" if it has not.
        answer_within: seconds the coordination service gets to answer one question before process 0 (its host)
            is named stalled or lost.
        exit: how the process ends (``os._exit``, which skips the runtime's shutdown barrier, which would
            wait for the lost process); tests pass their own.

    Examples:
        >>> import tempfile
        >>> from ember import Engine
        >>> from ember.handlers import Checkpoint, ProcessWatchdog
        >>> trainer = Engine(lambda e, b: b)
        >>> watchdog = ProcessWatchdog(Checkpoint({"trainer": trainer}, tempfile.mkdtemp()))
        >>> _ = watchdog.attach(trainer)
        >>> trainer.run([1, 2]).iteration, watchdog.lost()  # one process: nothing to watch
        (2, [])
    """

    def __init__(
        self,
        checkpoint: Checkpoint | None = None,
        *,
        poll_every: float = 1.0,
        confirm_within: float = 30.0,
        answer_within: float = 10.0,
        exit: Callable[[int], Any] = os._exit,
    ) -> None:
        if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                f"`checkpoint` must be an ember.handlers.Checkpoint or None, got {type(checkpoint).__name__}."
            )
        if checkpoint is not None and checkpoint.store is None:
            raise TypeError(
                "`checkpoint` must write into one of ember's stores (a folder, a CheckpointStore, a DiskSaver): the "
                "watchdog names the newest checkpoint committed there."
            )
        if isinstance(poll_every, bool) or not isinstance(poll_every, int | float) or poll_every <= 0:
            raise ValueError(f"`poll_every` must be a positive number of seconds, got {poll_every!r}.")
        if isinstance(confirm_within, bool) or not isinstance(confirm_within, int | float) or confirm_within < 0:
            raise ValueError(f"`confirm_within` must be a number of seconds >= 0, got {confirm_within!r}.")
        self.checkpoint, self.poll_every, self._exit = checkpoint, float(poll_every), exit
        if isinstance(answer_within, bool) or not isinstance(answer_within, int | float) or answer_within <= 0:
            raise ValueError(f"`answer_within` must be a positive number of seconds, got {answer_within!r}.")
        self.confirm_within, self.answer_within = float(confirm_within), float(answer_within)
        self.watch = Watch("ember-process-watchdog", self.poll_every, self._check)
        self.pinging = Watch("ember-process-watchdog-ping", self.poll_every, self._ping)
        self._ending = threading.Lock()

    def lost(self) -> list[int]:
        """The processes the coordination service no longer counts as alive (``[]`` in a single process).

        Raises ``RuntimeError`` when the service cannot be reached (process 0 is gone).
        """
        client = coordination_client()
        if client is None:
            return []
        import jax

        everyone = list(range(jax.process_count()))
        try:
            alive = client.get_live_nodes(everyone)  # it waits for every live process to ask: a stalled one, until lost
        except Exception as e:  # the service itself is gone with process 0
            raise RuntimeError(f"the coordination service on process 0 cannot be reached ({e})") from None
        return [p for p in everyone if p not in alive]

    def message(self, lost: list[int] | None, why: str) -> str:
        """What the watchdog prints before it ends the process."""
        import jax

        who = f"process {', '.join(map(str, lost))}" if lost else "another process"
        where = "no checkpoint is committed in its folder; relaunching starts from the beginning"
        # a save commits through the coordination service: with process 0 gone none will, and the runtime may end this
        # process any moment now (its heartbeats to the service fail): no grace then
        info = self._committed(0.0 if lost and 0 in lost else SAVE_GRACE)
        if self.checkpoint is None:  # a job that keeps its own state (an evaluation job's watch.json)
            where = "relaunching resumes from what it recorded"
        elif info is not None:
            where = f"the last complete checkpoint is {info.path} (step {info.step}); relaunching resumes from it"
        return (
            f"ember: {who} of this {jax.process_count()}-process run was lost ({why}). Process "
            f"{jax.process_index()} stops here with exit status {EXIT_CODE}: {where}. Relaunch every process."
        )

    def _committed(self, grace: float) -> Any:
        """The newest checkpoint on disk, once a save in flight has had ``grace`` seconds to land."""
        if self.checkpoint is None or self.checkpoint.store is None:
            return None
        with contextlib.suppress(Exception):  # a save that needs the lost process never finishes; one that fails, fails
            self.checkpoint.store.wait(timeout=grace)
        try:
            return self.checkpoint.latest_committed()
        except OSError:  # the folder cannot be read: say so rather than name nothing
            return None

    def _end(self, lost: list[int] | None, why: str) -> None:
        if not self._ending.acquire(blocking=False):
            return  # the other watch is ending the process
        sys.stderr.write(self.message(lost, why) + "\n")  # one write: a traceback printed meanwhile stays off its line
        sys.stderr.flush()
        sys.stdout.flush()
        self._exit(EXIT_CODE)

    def _check(self) -> bool:
        """On the watch's thread: end this process if another is lost; whether it did."""
        try:
            lost = self.lost()
        except RuntimeError as e:
            self._end([0], str(e))
            return True
        if lost:
            import jax

            me = jax.process_index()  # declared lost itself: this process stalled past the heartbeat timeout
            why = "it stopped answering the coordination service"
            self._end([me] if me in lost else lost, f"{why}: this process stalled" if me in lost else why)
        return bool(lost)

    def _ping(self) -> bool:
        """On the ping's thread: end this process if the service (on process 0) does not answer in time.

        A lookup, which a live service answers at once: `lost` cannot tell a stalled process 0, as it waits for a
        stalled process as for a slow one. ``answer_within`` seconds without an answer name process 0.
        """
        client = coordination_client()
        if client is None:
            return True
        answered = threading.Event()

        def ask() -> None:
            with contextlib.suppress(Exception):  # "not found" is an answer; a service gone is `lost`'s to say
                client.key_value_try_get("ember/watchdog-ping")
            answered.set()

        threading.Thread(target=ask, name="ember-process-watchdog-question", daemon=True).start()
        if answered.wait(self.answer_within):
            return False
        self._end(
            [0],
            f"the coordination service on process 0 did not answer within {self.answer_within:g} s: process 0 stalled "
            "or was lost",
        )
        return True

    def _start(self) -> None:
        if coordination_client() is not None:
            self.watch.start()
            self.pinging.start()

    def _finish(self) -> None:
        self.watch.stop()
        self.pinging.stop()

    def _failed(self, _engine: Engine | None, error: BaseException) -> None:
        self._finish()
        if isinstance(error, ProcessesMissing):  # a wait where the processes meet ran out: they are named
            self._end(error.missing, f"it {error.why}")
            return
        text = str(error)
        if coordination_client() is None or not any(sign in text for sign in _PEER_GONE):
            return  # an ordinary error: it propagates as usual
        lost = self._confirm()
        first_line = text.strip().splitlines()[0][:200] if text.strip() else type(error).__name__
        self._end(lost or None, f"a collective failed: {first_line}")

    def _confirm(self) -> list[int]:
        """The lost processes, once the service has declared them (within ``confirm_within`` seconds)."""
        import jax

        waited = 0.0
        while True:
            try:
                lost = self.lost()
            except RuntimeError:
                return [0]
            # without recoverability the runtime aborts this process when the service declares the loss
            if lost or not jax.config.values.get("jax_enable_recoverability") or waited >= self.confirm_within:
                return lost
            self.watch.wait(self.poll_every)
            waited += self.poll_every

    @contextlib.contextmanager
    def watching(self) -> Generator[None]:
        """Watch for the length of a block: a job of several processes that is not one engine's run.

        As `attach` does for a trainer's run: a thread asks the coordination service who is alive, and an error
        raised in the block because a peer's connection closed ends this process (status 75) instead of
        propagating. ``ember eval --watch --distributed`` runs its whole loop in it.

        Examples:
            >>> from ember.handlers import ProcessWatchdog
            >>> with ProcessWatchdog().watching():  # one process: nothing to watch
            ...     print("evaluating")
            evaluating
        """
        self._start()
        try:
            yield
        except Exception as e:
            self._failed(None, e)  # ends the process if a peer is gone; an ordinary error goes on
            raise
        finally:
            self._finish()

    def attach(self, trainer: Engine) -> RemovableEventHandle:
        """Watch from the trainer's STARTED to its COMPLETED; act on a failed collective at EXCEPTION_RAISED.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import ProcessWatchdog
            >>> _ = ProcessWatchdog().attach(Engine(lambda e, b: b))
        """
        with collect_handles() as made:
            trainer.add_event_handler(Events.STARTED, self._start)
            trainer.add_event_handler(Events.COMPLETED, self._finish)
            trainer.add_event_handler(Events.EXCEPTION_RAISED, self._failed)
        return made.handle
