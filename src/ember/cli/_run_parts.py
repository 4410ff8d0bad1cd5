"""The parts of an `ember train` run, each built from its section of the config: console, engines, handlers."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, cast

import jax

from ember import Engine, Events
from ember._atomic_file import replace_file
from ember._run_identity import run_identity
from ember.cli._classifier import build_trainer, learning_rates, predict
from ember.cli._config import Config, dump_config
from ember.cli._distributed import heartbeat_timeout
from ember.cli._early_signals import hand_over
from ember.cli._evaluations.sections import Extra, build_evaluations, classifier_evaluator
from ember.cli._registry import build_data, build_model, check_labels
from ember.cli._run_checkpoints import attach_checkpoints, start_from
from ember.cli._run_course import SKIP_LIMIT, logged_outputs, nan_check, runs_on, watching
from ember.cli._run_record import LAST_EVALUATION, LastEvaluation
from ember.cli._verify_resume import KILL_AT
from ember.handlers import (
    Checkpoint,
    EarlyStopping,
    Evaluate,
    Evaluations,
    GoodputLedger,
    LRMonitor,
    Preemption,
    ProcessWatchdog,
    ProgressBar,
    RollbackOnDivergence,
    ScalarLogger,
    StallWatchdog,
    StragglerReport,
    TerminateOnNan,
    WeightsHistHandler,
)
from ember.handlers._reporting.display import shown_as
from ember.metrics import RunningAverage
from ember.training import Sharded
from ember.writers import AsyncWriter, create_run_writer
from ember.writers._mlflow import flat_settings


@dataclass
class Console:
    """Where a run's lines go: printed by process 0 only, above the progress bars when there are bars."""

    out: TextIO
    bar: bool  # the bar only on a terminal: a batch log (a file, a pipe: Slurm, CI, nohup) gets one line an epoch
    progress_stream: TextIO | None
    primary: bool = field(default_factory=lambda: jax.process_index() == 0)

    @classmethod
    def open(cls, cfg: Config, stream: TextIO | None, progress_stream: TextIO | None) -> Console:
        """The console of a run of ``cfg`` printing to ``stream`` (stdout), its bars on ``progress_stream`` (stderr)."""
        out = stream or sys.stdout
        bar = cfg.handlers.progress and shown_as("auto", progress_stream) != "lines"  # the bar's own decision
        return cls(cast(TextIO, _AboveBars(out)) if bar else out, bar, progress_stream)

    def say(self, text: str) -> None:
        """Print a line of the run's (on process 0)."""
        if self.primary:
            print(text, file=self.out)


@dataclass
class Engines:
    """What the data, model, optimizer and trainer sections build: the data, the trainer and its evaluator."""

    data: Any
    val: Any
    steps_per_epoch: int | None
    trainer: Any
    evaluator: Any
    relaunched: bool  # the run folder had a config already: a relaunch of the run
    extra: Extra = field(default_factory=dict)  # the evaluations beside val: name -> (evaluator, data, schedule)

    def evaluator_of(self, name: str) -> Any:
        """The evaluator of the evaluation ``name`` (``val``, or one of ``evaluations``)."""
        return self.evaluator if name == "val" else self.extra[name][0]

    @property
    def evaluators(self) -> list[Any]:
        """Every evaluator of the run, ``val``'s first."""
        return [self.evaluator, *(evaluator for evaluator, _, _ in self.extra.values())]


def build_engines(cfg: Config, run_dir: Path, source: str | Path | None, console: Console) -> Engines:
    """The run's data and engines; the run folder and its ``config.yaml`` are written once they can be built."""
    data, val, sample = build_data(cfg.data)
    steps_per_epoch, schedule = learning_rates(cfg, data)
    check_labels(cfg.data, data, build_model(cfg.model, cfg.trainer.seed), sample, cfg.model.name)
    trainer = build_trainer(cfg, sample, schedule)
    # another run's weights, at this run's first launch
    started = start_from(cfg.init, trainer, run_dir, cfg.handlers.checkpoint)
    relaunched = (run_dir / "config.yaml").exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    if console.primary:
        (run_dir / "config.yaml").write_text(dump_config(cfg, source))
        run_identity(run_dir)  # run.json: the run's id and where it was made, once
        if started is not None:  # what it started from, once: a relaunch resumes from its own checkpoints
            replace_file(run_dir, "init.json", json.dumps(dataclasses.asdict(started), indent=1))
    console.say(runs_on(trainer, cfg))
    if started is not None:
        console.say(f"Started {started}")
    also = watching(cfg, run_dir)
    if also is not None:
        console.say(also)
    if isinstance(trainer.placement, Sharded):
        console.say(f"{trainer.placement.summary()}\n{trainer.placement.layout(trainer.state.train_state)}")
    evaluator = classifier_evaluator(cfg, trainer, predict)
    RunningAverage(output_transform=lambda o: o["loss"]).attach(trainer, "loss")
    extra = build_evaluations(cfg, trainer, val, predict)
    return Engines(data, val, steps_per_epoch, trainer, evaluator, relaunched, extra)


@dataclass
class Handlers:
    """What the handlers section attaches that the run reads again: its records, checkpoints and stops."""

    writer: AsyncWriter
    best: Checkpoint
    latest: Checkpoint
    preemption: Preemption
    stopper: EarlyStopping | None
    nan_guard: TerminateOnNan
    skip_limit: int
    last: LastEvaluation


def attach_handlers(cfg: Config, engines: Engines, run_dir: Path, console: Console) -> Handlers:
    """The stock handlers of a run, in the order they must fire: records, evaluation, stops, checkpoints, survival."""
    trainer, evaluator, h = engines.trainer, engines.evaluator, cfg.handlers
    writer = create_run_writer(run_dir, h.writers, stream=console.out, params=cfg)
    state = trainer.state.train_state  # what the precision and the guard added to it is logged too
    scaled, guarded = state.loss_scale is not None, state.guard is not None
    every = Events.ITERATION_COMPLETED(every=h.log_every)
    ScalarLogger(writer, tag="train", metric_names=["loss"], output_transform=logged_outputs(scaled, guarded)).attach(
        trainer, every
    )
    LRMonitor(writer, tag="train/lr").attach(trainer, every)
    last = LastEvaluation()  # before the handlers that read it at the validation's end
    evaluator.add_event_handler(Events.COMPLETED, lambda e: last.seen(e.state.metrics))
    _attach_tensorboard_tabs(cfg, trainer, last, writer, resumable=lambda: preemption.saved is not None)
    if console.bar:  # before Evaluate: each epoch's bar is finished and cleared before the epoch's line is printed
        bar = ProgressBar(refresh_every=10, persist=True, stream=console.progress_stream, desc="Epoch")
        bar.attach(trainer, metric_names=["loss"])
    Evaluate(evaluator, engines.val, writer=writer, tag="val").attach(
        trainer, Events.EPOCH_COMPLETED(every=cfg.trainer.eval_every)
    )
    if engines.extra:  # each under its name, before the trainer's other handlers of its event
        evaluations = Evaluations(trainer, writer=writer)
        for name, (extra, data, schedule) in engines.extra.items():
            evaluations.add(name, extra, data, schedule)
    to_save: dict[str, Any] = {"trainer": trainer}  # its state dict holds the data's position
    stopper = _early_stopping(cfg, engines, to_save)
    scored = engines.evaluator_of(h.checkpoint.best_on)
    carried = {LAST_EVALUATION: last}  # the run's result, through relaunches
    best, latest = attach_checkpoints(h.checkpoint, run_dir, to_save, trainer, scored, writer, carried)
    preemption = Preemption(latest, signals=(signal.SIGTERM, signal.SIGINT))  # Ctrl-C saves and stops, as SIGTERM
    preemption.attach(trainer, engines.evaluators)
    hand_over(preemption, trainer)  # a signal noted after the last safe point before training: Preemption's
    skip_limit = max(engines.steps_per_epoch or SKIP_LIMIT, (cfg.trainer.rollback_after or 0) + 1)
    nan_guard = TerminateOnNan(nan_check(guarded, skip_limit))  # a skip is the guard's; an epoch of skips, a stop
    nan_guard.attach(trainer)
    _attach_survival(cfg, trainer, engines.evaluators, run_dir, (latest, best), console, writer)
    if "console" not in h.writers:  # the console writer prints the evaluations' numbers itself
        for name in ("val", *engines.extra):
            engines.evaluator_of(name).add_event_handler(Events.COMPLETED, _said(name, trainer, console))
    return Handlers(writer, best, latest, preemption, stopper, nan_guard, skip_limit, last)


def _said(name: str, trainer: Engine, console: Console) -> Callable[[Engine], None]:
    """What prints an evaluation's line: ``epoch   2  iteration    44  val accuracy 0.9375  val loss 0.2210``."""

    def say(evaluator: Engine) -> None:
        metrics = evaluator.state.metrics
        console.say(
            f"epoch {trainer.state.epoch:3d}  iteration {trainer.state.iteration:5d}  "
            f"{name} accuracy {metrics['accuracy']:.4f}  {name} loss {metrics['loss']:.4f}"
        )

    return say


def _attach_tensorboard_tabs(
    cfg: Config, trainer: Engine, last: LastEvaluation, writer: AsyncWriter, *, resumable: Callable[[], bool]
) -> None:
    """The parameters' histograms every ``handlers.histograms`` iterations; the HParams tab at the run's end.

    The ``hparams`` record is the run's, once: written when the run ends, not when a signal stops a launch
    (``resumable``), with the run's last validation (``last``, which relaunches carry on).
    """
    if cfg.handlers.histograms is not None:
        WeightsHistHandler(writer).attach(trainer, Events.ITERATION_COMPLETED(every=cfg.handlers.histograms))
    if cfg.handlers.hparams:
        settings = flat_settings(dataclasses.asdict(cfg)).items()  # HParams takes numbers, bools and text
        hparams = {k: v if isinstance(v, bool | int | float | str) else str(v) for k, v in settings if k != "output"}

        def record(_: Engine) -> None:  # the last validation's numbers: the run's result beside its settings
            if not resumable():
                writer.write_hparams(hparams, {f"val/{k}": v for k, v in last.metrics.items()})

        trainer.add_event_handler(Events.COMPLETED, record)


def _early_stopping(cfg: Config, engines: Engines, to_save: dict[str, Any]) -> EarlyStopping | None:
    """Early stopping on the ``metric`` of the evaluation ``on`` names, at each of its evaluations."""
    es = cfg.handlers.early_stopping
    if es is None:
        return None
    stopper = EarlyStopping(
        es.patience,
        lambda e: e.state.metrics[es.metric],
        engines.trainer,
        threshold=es.threshold,
        mode="max" if es.metric == "accuracy" else "min",
    )
    stopper.attach(engines.evaluator_of(es.on))
    to_save["early_stopping"] = stopper
    return stopper


def _attach_survival(
    cfg: Config,
    trainer: Any,
    evaluators: list[Engine],
    run_dir: Path,
    checkpoints: tuple[Checkpoint, Checkpoint],
    console: Any,
    writer: AsyncWriter,
) -> None:
    """Rollbacks, stragglers, the goodput ledger, the stall and process watchdogs, verify-resume's kill: as set."""
    latest = checkpoints[0]
    if cfg.trainer.skip_nonfinite and cfg.trainer.rollback_after is not None:
        rollback = RollbackOnDivergence(latest, after=cfg.trainer.rollback_after)
        rollback.attach(trainer)
        trainer.add_event_handler(Events.ITERATION_COMPLETED, _announcer(rollback, console.say))
    stragglers = cfg.handlers.stragglers
    report = None  # which process holds the others back (nothing attached in one process)
    if stragglers is not None:
        report = StragglerReport(
            writer, every=stragglers.every, factor=stragglers.factor, patience=stragglers.patience, say=console.say
        )
        report.attach(trainer)
    if console.primary:  # where the wall time went, across every relaunch: goodput.jsonl, `ember goodput RUN_DIR`
        GoodputLedger(run_dir).attach(trainer, evaluators=evaluators, checkpoints=checkpoints, stragglers=report)
    stall = cfg.handlers.stall
    if stall is not None:  # a hang ends the run with every thread's stack in the run folder, exit status 75
        StallWatchdog(
            run_dir,
            step_timeout=stall.step_timeout,
            startup_timeout=stall.startup_timeout,
            save_timeout=stall.save_timeout,
        ).attach(trainer, evaluators=evaluators, checkpoints=checkpoints)
    if jax.process_count() > 1:  # a lost process ends the others at once, naming the checkpoint to resume from
        ProcessWatchdog(latest, answer_within=heartbeat_timeout() / 2).attach(trainer)
    if os.environ.get(KILL_AT):  # ember verify-resume's real SIGKILL, once that iteration is done
        at = int(os.environ[KILL_AT])
        trainer.add_event_handler(Events.ITERATION_COMPLETED(once=at), lambda: os.kill(os.getpid(), signal.SIGKILL))


class _AboveBars(io.TextIOBase):
    """A stream whose lines go through ``tqdm.write``: printed above the progress bars, never glued onto one."""

    def __init__(self, out: TextIO) -> None:
        self.out, self._line = out, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        from tqdm import tqdm

        self._line += text
        *lines, self._line = self._line.split("\n")
        for line in lines:
            tqdm.write(line, file=self.out)
        return len(text)

    def flush(self) -> None:
        self.out.flush()


def _announcer(rollback: RollbackOnDivergence, say: Any) -> Any:
    """A handler that prints each rollback once, on the console, as it happens."""
    said = [0]

    def announce() -> None:
        for done in rollback.rollbacks[said[0] :]:
            say(str(done))
        said[0] = len(rollback.rollbacks)

    return announce


def use_compilation_cache(setting: str | None) -> None:
    """Turn JAX's persistent compilation cache on as ``trainer.compilation_cache`` says, unless JAX has one already.

    ``auto`` is the user's cache folder (``$XDG_CACHE_HOME/ember/jax``, else ``~/.cache/ember/jax``): it outlives any
    run folder, a temporary one included (JAX keeps writing to the folder it was given for the rest of the process,
    so a folder removed with its run would fail every later write), and a relaunch from anywhere finds its entries.
    Every program is kept, however quickly it compiled, unless JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS says
    otherwise.
    """
    if setting is None or jax.config.values.get("jax_compilation_cache_dir"):
        return
    folder = user_cache_folder() if setting == "auto" else Path(setting).resolve()
    jax.config.update("jax_compilation_cache_dir", str(folder))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        # JAX keeps only programs that took over a second to compile: none of the digits run's (0.9 s, 0.1 s), so a
        # relaunch compiled everything again. Kept, a relaunch starts 2.7 s sooner for 0.17 s more on the first run.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def user_cache_folder() -> Path:
    """Where ``trainer.compilation_cache: auto`` keeps JAX's compiled programs: the user's cache folder, for ember.

    Examples:
        >>> from ember.cli._run_parts import user_cache_folder
        >>> user_cache_folder().parts[-2:]
        ('ember', 'jax')
    """
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser().resolve() / "ember" / "jax"
