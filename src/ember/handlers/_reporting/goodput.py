"""`GoodputLedger`: where a run's wall time went, appended to ``goodput.jsonl`` across every relaunch."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ember._ledger_file import CATEGORIES, FILENAME, RESTART_VARIABLE, read_records
from ember.engine import Engine, Events, RemovableEventHandle, collect_handles
from ember.handlers._checkpointing.checkpoint import Checkpoint, checkpoints_given
from ember.handlers._reporting.stragglers import StragglerReport


def _process_start(clock: Callable[[], float]) -> float:
    """When this process started, on ``clock``'s scale (Linux: from /proc; elsewhere: now)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        age = 0.0
    return clock() - max(0.0, age)


def _restart(started: float) -> dict[str, Any] | None:
    """The restart this process is, from ``ember launch --max-restarts`` (``RESTART_VARIABLE``), or ``None``.

    ``started`` is when the process started, by ``time.time()``: ``waited`` is the seconds from the failure the
    launcher saw to then.
    """
    try:
        given = json.loads(os.environ[RESTART_VARIABLE])
        cause, failed_at = str(given["cause"]), float(given["failed_at"])
        return {"number": int(given["number"]), "of": int(given["of"]), "cause": cause, "waited": started - failed_at}
    except (KeyError, TypeError, ValueError):
        return None


class GoodputLedger:
    """Splits a run's wall time into categories and appends them to ``run_dir/goodput.jsonl``, across relaunches.

    Measured on the training thread: **startup** (from the process's start to the trainer's STARTED: imports, data,
    the state built), **compilation** (the run's first training step, which compiles; JAX's persistent-cache hits
    and the compilation time they saved are counted too), **productive** (the other training steps), **data**
    (waiting for the next batch), **checkpoint** (the time the attached checkpoints' saves blocked the training
    thread), **evaluation** (the evaluators' runs), **lost** (the steps a relaunch trains again because they came
    after the checkpoint it resumed from, at the earlier run's productive time per step), and **other** (handlers,
    logging: the rest, so the categories add up to the wall time). Each run (a process's ``run()``) writes one record
    of cumulative numbers, again every ``flush_every`` seconds, with each checkpoint of the attached ``checkpoints``
    and when it ends, so a run killed without warning leaves its numbers up to its last write, and at least up to
    the checkpoint its relaunch resumes from: the relaunch counts the steps trained again exactly as those past that
    write. A process ``ember launch --max-restarts`` restarted records which restart it is, what ended the launch
    before, and the seconds from that failure to its own start (``restart``; not in the wall time). `ember goodput
    RUN_DIR` prints the table over the run's whole life; a launch whose record never said it ended, followed by
    another, shows as ``killed``.

    Args:
        run_dir: the run folder (``goodput.jsonl`` is appended to there).
        flush_every: seconds between two writes of the running record (0: every iteration).
        clock: the monotonic clock (injectable for tests).
        started: when the process started, on ``clock``'s scale; by default read from the operating system.

    Examples:
        >>> import tempfile
        >>> from ember import Engine
        >>> from ember.handlers import GoodputLedger
        >>> folder = tempfile.mkdtemp()
        >>> engine = Engine(lambda e, b: b)
        >>> ledger = GoodputLedger(folder)
        >>> _ = ledger.attach(engine)
        >>> _ = engine.run(range(4))
        >>> record = ledger.record()
        >>> record["steps"], record["ended"], round(sum(record[k] for k in ("startup", "compilation", "productive",
        ...     "data", "checkpoint", "evaluation", "other")) - record["wall"], 9)
        (4, 'completed', 0.0)
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        flush_every: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        started: float | None = None,
    ) -> None:
        if not isinstance(run_dir, str | os.PathLike):
            raise TypeError(f"`run_dir` must be a folder path, got {type(run_dir).__name__}.")
        if isinstance(flush_every, bool) or not isinstance(flush_every, int | float) or flush_every < 0:
            raise ValueError(f"`flush_every` must be a number of seconds >= 0, got {flush_every!r}.")
        self.path = Path(run_dir).resolve() / FILENAME
        self.flush_every, self.clock = float(flush_every), clock
        self._process_start = started if started is not None else _process_start(clock)
        self._checkpoints: list[Checkpoint] = []
        self._cache = {"hits": 0, "saved": 0.0}
        self._stragglers: StragglerReport | None = None
        self._runs = 0
        self._eval_mark = self._blocked_at_eval = self._blocked_at_mark = 0.0
        self._reset()

    def _reset(self) -> None:
        self._run = uuid.uuid4().hex[:12]
        self._t: dict[str, float] = dict.fromkeys(CATEGORIES, 0.0)
        self._mark = self._begin = self._last_flush = self.clock()
        self._first_iteration: int | None = None
        self._iteration = 0
        self._steps = 0
        self._lost_steps = 0
        self._restart: dict[str, Any] | None = None
        self._blocked_at_start = 0.0
        self._ended = "running"

    # -- the trainer's events ------------------------------------------------------------------------

    def _started(self, engine: Engine) -> None:
        now = self.clock()
        self._reset()
        self._runs += 1
        self._begin = self._process_start if self._runs == 1 else now  # a later run() in this process: from now
        self._t["startup"] = now - self._begin
        if self._runs == 1:  # the process's first run is the restart; a later run() in it is not
            self._restart = _restart(time.time() - (now - self._process_start))
        self._first_iteration = self._iteration = engine.state.iteration
        self._blocked_at_start = self._blocked()
        earlier = [r for r in read_records(self.path.parent) if r.get("last_iteration") is not None]
        if earlier and engine.state.iteration < max(r["last_iteration"] for r in earlier):
            before = max(earlier, key=lambda r: r["last_iteration"])
            self._lost_steps = before["last_iteration"] - engine.state.iteration
            per_step = before["productive"] / before["steps"] if before.get("steps") else 0.0
            self._t["lost"] = self._lost_steps * per_step  # time an earlier run spent on steps trained again
        self._write()

    def _mark_now(self) -> None:
        """Where the batch fetch or the step being timed began."""
        self._mark = self.clock()

    def _got_batch(self) -> None:
        self._t["data"] += self.clock() - self._mark

    def _blocked(self) -> float:
        """Seconds the checkpoints have blocked so far: a save inside a step or an evaluation is counted once."""
        return sum(c.blocked for c in self._checkpoints) if self._checkpoints else 0.0

    def _iteration_started(self) -> None:
        self._mark, self._blocked_at_mark = self.clock(), self._blocked()

    def _iteration_done(self, engine: Engine) -> None:
        now = self.clock()
        spent = now - self._mark - (self._blocked() - self._blocked_at_mark)  # a save at this event is checkpoint's
        self._t["compilation" if self._steps == 0 else "productive"] += spent
        self._steps += 1
        self._iteration = engine.state.iteration
        if now - self._last_flush >= self.flush_every:
            self._write()

    def _evaluation_started(self) -> None:
        self._eval_mark, self._blocked_at_eval = self.clock(), self._blocked()

    def _evaluation_done(self) -> None:
        self._t["evaluation"] += self.clock() - self._eval_mark - (self._blocked() - self._blocked_at_eval)

    def _completed(self) -> None:
        self._ended = "completed"
        self._write()

    def _failed(self, engine: Engine, error: BaseException) -> None:
        self._ended = f"failed: {type(error).__name__}"
        self._write()

    def _on_cache_hit(self, event: str) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            self._cache["hits"] += 1

    def _on_duration(self, event: str, duration: float) -> None:
        if event == "/jax/compilation_cache/compile_time_saved_sec":  # JAX's estimate: below 0 when a load was slow
            self._cache["saved"] += max(0.0, duration)

    # -- the record ----------------------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        """The running run's record: wall time by category, iterations, steps, persistent-cache hits.

        Examples:
            >>> import tempfile
            >>> from ember.handlers import GoodputLedger
            >>> GoodputLedger(tempfile.mkdtemp()).record()["ended"]
            'running'
        """
        now = self.clock()
        t = dict(self._t)
        t["checkpoint"] = self._blocked() - self._blocked_at_start
        wall = now - self._begin
        t["other"] = wall - sum(v for k, v in t.items() if k not in ("other", "lost"))
        return {
            "run": self._run,
            "time": time.time(),
            "wall": wall,
            **t,
            "cache_hits": self._cache["hits"],
            "cache_saved": self._cache["saved"],
            "first_iteration": self._first_iteration,
            "last_iteration": self._iteration,
            "steps": self._steps,
            "lost_steps": self._lost_steps,
            "ended": self._ended,
            **({"restart": self._restart} if self._restart else {}),
            **({"stragglers": spread} if (spread := self._spread()) else {}),
        }

    def _spread(self) -> dict[str, Any] | None:
        """The straggler report's summary, once it has compared a window."""
        report = self._stragglers
        summary = report.summary() if report is not None else None
        return summary if summary and summary["windows"] else None

    def _write(self) -> None:
        self._last_flush = self.clock()
        if not self.path.parent.is_dir():  # a stat at each save (on the training thread), not mkdir's exception
            self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(self.record()) + "\n")

    def attach(
        self,
        trainer: Engine,
        evaluators: Sequence[Engine] = (),
        checkpoints: Sequence[Checkpoint] = (),
        stragglers: StragglerReport | None = None,
    ) -> RemovableEventHandle:
        """Measure ``trainer``'s runs; ``evaluators``' runs count as evaluation, ``checkpoints``' saves as checkpoint.

        With ``stragglers``, each record also keeps its `summary` (the processes' step times and times outside it, who
        lagged), and ``ember goodput`` shows the spread.

        Examples:
            >>> import tempfile
            >>> from ember import Engine
            >>> from ember.handlers import GoodputLedger
            >>> handle = GoodputLedger(tempfile.mkdtemp()).attach(Engine(lambda e, b: b))
        """
        self._checkpoints = checkpoints_given(checkpoints)
        self._stragglers = stragglers
        _listen(self)
        listening = [True]

        def checkpoint_saving(step: int) -> None:  # the record reaches disk with each checkpoint a relaunch may use
            if listening[0]:
                self._iteration = max(self._iteration, trainer.state.iteration)
                self._write()

        for checkpoint in self._checkpoints:
            checkpoint.add_save_listener(checkpoint_saving)
        with collect_handles() as made:
            made.on_remove(lambda: listening.__setitem__(0, False))
            trainer.add_event_handler(Events.STARTED, self._started)
            trainer.add_event_handler(Events.GET_BATCH_STARTED, self._mark_now)
            trainer.add_event_handler(Events.GET_BATCH_COMPLETED, self._got_batch)
            trainer.add_event_handler(Events.ITERATION_STARTED, self._iteration_started)
            trainer.add_event_handler(Events.ITERATION_COMPLETED, self._iteration_done)
            trainer.add_event_handler(Events.COMPLETED, self._completed)
            trainer.add_event_handler(Events.EXCEPTION_RAISED, self._failed)
            for evaluator in evaluators:
                evaluator.add_event_handler(Events.STARTED, self._evaluation_started)
                evaluator.add_event_handler(Events.COMPLETED, self._evaluation_done)
        return made.handle


_LEDGERS: list[GoodputLedger] = []


def _listen(ledger: GoodputLedger) -> None:
    """Count JAX's persistent-cache hits for ``ledger`` (JAX's listeners cannot be removed: one pair per process)."""
    import jax

    def on_event(event: str, **kwargs: str | int) -> None:
        for x in _LEDGERS:
            x._on_cache_hit(event)

    def on_duration(event: str, duration_secs: float, **kwargs: str | int) -> None:
        for x in _LEDGERS:
            x._on_duration(event, duration_secs)

    if not _LEDGERS:
        jax.monitoring.register_event_listener(on_event)
        jax.monitoring.register_event_duration_secs_listener(on_duration)
    _LEDGERS[:] = [ledger]  # the newest ledger counts; an earlier one's run is over
