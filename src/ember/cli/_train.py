"""`ember train`: build a run from a config, train it with the stock handlers, resume it if it was started."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO, cast

import jax
import optax
from jax.experimental import multihost_utils

from ember import Events
from ember.cli._compilation_cache import use_compilation_cache
from ember.cli._config import Config, ConfigError, config_source, dump_config, importable, load_config
from ember.cli._registry import (
    build_data,
    build_model,
    build_optimizer,
    build_placement,
    build_schedule,
    check_labels,
)
from ember.cli._run_checkpoints import attach_checkpoints, close_stores, shared_run_id
from ember.cli._run_course import (
    SKIP_LIMIT,
    finished,
    logged_outputs,
    nan_check,
    runs_on,
    skipped_line,
    why_stopped,
)
from ember.cli._run_record import check_same_run, closing_line, saved_summary
from ember.cli._verify_resume import KILL_AT
from ember.handlers import (
    EarlyStopping,
    Evaluate,
    GoodputLedger,
    LRMonitor,
    Preemption,
    ProcessWatchdog,
    ProgressBar,
    RollbackOnDivergence,
    ScalarLogger,
    StallWatchdog,
    TerminateOnNan,
)
from ember.metrics import Accuracy, Loss, RunningAverage
from ember.training import Sharded, TrainState, create_evaluator, create_trainer
from ember.writers import AsyncWriter, create_run_writer


def _loss(model: Any, batch: Any) -> Any:
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()


def _predict(model: Any, batch: Any) -> Any:
    return {"y_pred": model(batch["x"]), "y": batch["y"]}


def _writers(config: Config, run_dir: Path, stream: TextIO) -> AsyncWriter:
    return create_run_writer(run_dir, config.handlers.writers, stream=stream, params=config)


def build_trainer(
    cfg: Config, sample: Any, schedule: Any = None, steps_per_call: int | None = None, *, lazy: bool = False
) -> Any:
    """The config's trainer (model, optimizer, placement) for inputs like ``sample``.

    With ``schedule=None`` the optimizer takes its learning rate as an injected hyperparameter (for the
    range test of ``ember lr-find``); else it follows ``schedule``. ``lazy``: the state is built from the first
    batch (``ember plan`` builds it abstractly, allocating nothing).
    """
    placement = build_placement(cfg.trainer)
    model, tx = build_model(cfg.model), build_optimizer(cfg.optimizer, schedule)

    def build(x: Any) -> TrainState:
        seed = cfg.trainer.seed  # a sharded placement builds the state sharded
        return TrainState.from_linen(model, x, tx, seed=seed, rngs=("dropout",), placement=placement)

    state: Any = (lambda batch: build(batch["x"][:1])) if lazy else build(sample)
    k = cfg.trainer.steps_per_call if steps_per_call is None else steps_per_call
    return create_trainer(
        state,
        _loss,
        placement=placement,
        steps_per_call=k,
        # the step reports its learning rate, which LRMonitor hands to the writer unread: no host computation per log
        extras=("lr",) if schedule is not None else (),
        lr_schedule=schedule,
        precision=cfg.trainer.precision,
        remat=cfg.trainer.remat,
        skip_nonfinite=cfg.trainer.skip_nonfinite,
        spike_factor=cfg.trainer.spike_factor,
    )


def train(
    config: Config | str | Path | dict[str, Any] | None = None,
    *,
    stream: TextIO | None = None,
    progress_stream: TextIO | None = None,
    source: str | Path | None = None,
) -> dict[str, Any]:
    """Train as ``config`` says, in ``config.output``; resume there if the run was started before.

    The run folder gets ``config.yaml``, ``checkpoints/latest`` and ``checkpoints/best``, TensorBoard
    files under ``tb/``, ``metrics.jsonl``, and ``summary.json``. Running the same config again resumes
    from the latest checkpoint (a finished run has nothing left to do, says so, and leaves its record as it
    was); a config that differs from the one the run was started with is refused, with the differences
    listed. A model named by an import path (``mymodels:Net``) is looked up in the config file's folder and
    the working directory too (both are put on ``sys.path``). ``source`` names that folder when ``config`` is
    already parsed (the command line passes it); the run folder's ``config.yaml`` records it, so that
    ``ember resume RUN_DIR`` finds the module from any folder.

    Ctrl-C (SIGINT) and SIGTERM save a checkpoint at the next iteration and stop; the same command resumes. A
    run ended by early stopping or a NaN loss is complete: the same command finds nothing left to do.

    Returns:
        The summary: ``{"run_dir", "resumed_from", "epochs", "iterations", "best_accuracy",
        "final_accuracy", "stopped_early", "stopped", "seconds"}``; ``stopped`` says why the run ended before its
        last epoch (``"early stopping"``, ``"a NaN loss"``, ``"SIGINT"``, ``"SIGTERM"``), or is ``None``.

    Examples:
        >>> import io, tempfile
        >>> from ember.cli import train
        >>> summary = train(
        ...     {"trainer": {"max_epochs": 1}, "handlers": {"progress": False}, "output": tempfile.mkdtemp()},
        ...     stream=io.StringIO(),
        ... )
        >>> summary["epochs"], summary["iterations"]
        (1, 22)
    """
    cfg = config if isinstance(config, Config) else load_config(config)
    if source is None and isinstance(config, str | Path):
        source = config_source(config)
    if source is not None:  # a model given as "mymodels:Net" may sit beside the (original) config file
        importable(source)
    importable(Path.cwd())
    out = stream or sys.stdout
    primary = jax.process_index() == 0  # in a run of several processes, process 0 prints and writes the files

    # the bar only on a terminal: a batch log (a file, a pipe: Slurm, CI, nohup) gets one line an epoch, no \r frames
    bar = cfg.handlers.progress and _on_a_terminal(progress_stream or sys.stderr)
    console = cast(TextIO, _AboveBars(out)) if bar else out  # lines above the bars, never on one

    def say(text: str) -> None:
        if primary:
            print(text, file=console)

    run_dir = Path(cfg.output)
    new_layout = check_same_run(run_dir, cfg)
    started = time.perf_counter()
    use_compilation_cache(cfg.trainer.compilation_cache)

    data, val, sample = build_data(cfg.data)
    steps_per_epoch = cfg.data.epoch_length or _length(data)
    if steps_per_epoch is None and cfg.trainer.max_iters is None:
        raise ConfigError(
            "data.epoch_length: the training data has no len(), so give its batches per epoch (or trainer.max_iters)."
        )
    total = cfg.trainer.max_iters or cfg.trainer.max_epochs * (steps_per_epoch or 0)
    schedule = build_schedule(cfg.optimizer, total)
    check_labels(cfg.data, data, build_model(cfg.model), sample, cfg.model.name)
    trainer = build_trainer(cfg, sample, schedule)
    relaunched = (run_dir / "config.yaml").exists()
    run_dir.mkdir(parents=True, exist_ok=True)  # the run can be built: its folder and config are written now
    if primary:
        (run_dir / "config.yaml").write_text(dump_config(cfg, source))
    say(runs_on(trainer, cfg))
    if isinstance(trainer.placement, Sharded):
        say(f"{trainer.placement.summary()}\n{trainer.placement.layout(trainer.state.train_state)}")
    evaluator = create_evaluator(trainer, _predict, placement=trainer.placement, precision=cfg.trainer.precision)
    Accuracy().attach(evaluator, "accuracy")
    Loss(optax.softmax_cross_entropy_with_integer_labels).attach(evaluator, "loss")
    RunningAverage(output_transform=lambda o: o["loss"]).attach(trainer, "loss")

    writer = _writers(cfg, run_dir, console)
    h = cfg.handlers
    built = trainer.state.train_state  # what the precision and the guard added to it is logged too
    scaled, guarded = built.loss_scale is not None, built.guard is not None
    ScalarLogger(writer, tag="train", metric_names=["loss"], output_transform=logged_outputs(scaled, guarded)).attach(
        trainer, Events.ITERATION_COMPLETED(every=h.log_every)
    )
    LRMonitor(writer, tag="train/lr").attach(trainer, Events.ITERATION_COMPLETED(every=h.log_every))
    if bar:  # before Evaluate: each epoch's bar is finished and cleared before the epoch's line is printed
        ProgressBar(refresh_every=10, persist=True, stream=progress_stream, desc="Epoch").attach(
            trainer, metric_names=["loss"]
        )
    Evaluate(evaluator, val, writer=writer, tag="val").attach(
        trainer, Events.EPOCH_COMPLETED(every=cfg.trainer.eval_every)
    )
    to_save: dict[str, Any] = {"trainer": trainer}  # its state dict holds the data's position
    stopper = None
    stopper_metric = None
    if h.early_stopping is not None:
        es = h.early_stopping
        stopper_metric = es.metric
        stopper = EarlyStopping(
            es.patience,
            lambda e: e.state.metrics[es.metric],
            trainer,
            threshold=es.threshold,
            mode="max" if es.metric == "accuracy" else "min",
        )
        stopper.attach(evaluator)
        to_save["early_stopping"] = stopper
    run_id = shared_run_id(run_dir)  # the run's own, in run.json: its fast checkpoint tier is its alone
    best, latest = attach_checkpoints(h.checkpoint, run_dir, to_save, trainer, evaluator, run_id, records=writer)
    preemption = Preemption(latest, signals=(signal.SIGTERM, signal.SIGINT))  # Ctrl-C saves and stops, as SIGTERM
    preemption.attach(trainer, [evaluator])
    skip_limit = max(steps_per_epoch or SKIP_LIMIT, (cfg.trainer.rollback_after or 0) + 1)
    nan_guard = TerminateOnNan(nan_check(guarded, skip_limit))  # a skip is the guard's; an epoch of skips, a stop
    nan_guard.attach(trainer)
    rollback = None
    if cfg.trainer.skip_nonfinite and cfg.trainer.rollback_after is not None:
        rollback = RollbackOnDivergence(latest, after=cfg.trainer.rollback_after)
        rollback.attach(trainer)
        trainer.add_event_handler(Events.ITERATION_COMPLETED, _announcer(rollback, say))
    if primary:  # where the wall time went, across every relaunch: goodput.jsonl, `ember goodput RUN_DIR`
        GoodputLedger(run_dir).attach(trainer, evaluators=[evaluator], checkpoints=[latest, best])
    if h.stall is not None:  # a hang ends the run with every thread's stack in the run folder, exit status 75
        StallWatchdog(
            run_dir,
            step_timeout=h.stall.step_timeout,
            startup_timeout=h.stall.startup_timeout,
            save_timeout=h.stall.save_timeout,
        ).attach(trainer, evaluators=[evaluator], checkpoints=[latest, best])
    if jax.process_count() > 1:  # a lost process ends the others at once, naming the checkpoint to resume from
        ProcessWatchdog(latest).attach(trainer)

    if os.environ.get(KILL_AT):  # ember verify-resume's real SIGKILL, once that iteration is done
        at = int(os.environ[KILL_AT])
        trainer.add_event_handler(Events.ITERATION_COMPLETED(once=at), lambda: os.kill(os.getpid(), signal.SIGKILL))
    accuracies: list[float] = []
    evaluator.add_event_handler(Events.COMPLETED, lambda e: accuracies.append(float(e.state.metrics["accuracy"])))
    if "console" not in h.writers:  # the console writer prints the evaluation's numbers itself
        evaluator.add_event_handler(
            Events.COMPLETED,
            lambda e: say(
                f"epoch {trainer.state.epoch:3d}  iteration {trainer.state.iteration:5d}  "
                f"val accuracy {e.state.metrics['accuracy']:.4f}  val loss {e.state.metrics['loss']:.4f}"
            ),
        )

    try:
        info = latest.resume()
        if info is not None:
            say(f"Resuming {run_dir} from {info.path.name} (iteration {info.step}).")
            if new_layout:
                say(f"Restored onto a new layout ({'; '.join(new_layout)}).")
        if info is not None and finished(trainer, cfg):
            say(f"{run_dir}: this run is already complete; nothing to do.")
            previous = saved_summary(run_dir)
            if previous is not None:  # the record of the run stays as the run left it
                writer.close()
                close_stores(best, latest)
                say(closing_line(previous))
                return previous
        else:
            if info is not None:  # the logs of steps past the checkpoint are dropped: the resumed run logs them again
                writer.resume_at(info.step)
            elif relaunched:  # killed before its first checkpoint, the run starts over, and so does its record
                writer.resume_at(0)
            if cfg.trainer.max_iters is not None:
                trainer.run(data, max_iters=cfg.trainer.max_iters, epoch_length=cfg.data.epoch_length)
            else:
                trainer.run(data, max_epochs=cfg.trainer.max_epochs, epoch_length=cfg.data.epoch_length)
    except BaseException as error:  # the trackers record the run as failed (killed: Ctrl-C) with every record kept
        _close_failed(writer, error)
        raise
    close_stores(best, latest)  # their writer threads end with the run (a notebook runs many)
    if jax.process_count() > 1:  # process 0 has written every checkpoint: all read the same best
        multihost_utils.sync_global_devices("ember train: checkpoints written")
    best_info = best.store.best("val_accuracy") if best.store is not None else None
    stopped = why_stopped(trainer, preemption, stopper, nan_guard, skip_limit)
    if stopped == "early stopping" and stopper is not None:
        say(
            f"Early stopping: val {stopper_metric} did not improve for {stopper.patience} evaluations; stopped at "
            f"epoch {trainer.state.epoch}."
        )
    elif stopped == "a NaN loss":
        say(f"Stopped: the training loss became NaN or infinite at iteration {nan_guard.nan_iteration}.")
    elif stopped == "skipped updates":
        say(skipped_line(trainer, skip_limit))
    summary = {
        "run_dir": str(run_dir),
        "resumed_from": None if info is None else info.step,
        "epochs": trainer.state.epoch,
        "iterations": trainer.state.iteration,
        "best_accuracy": None if best_info is None else best_info.metrics["val_accuracy"],
        "final_accuracy": accuracies[-1] if accuracies else None,
        "stopped_early": stopped == "early stopping",
        "stopped": stopped,
        "seconds": round(time.perf_counter() - started, 2),
    }
    if primary:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    # a signal stopped it: "killed" (MLflow KILLED), and the relaunch continues the same tracker run
    writer.set_outcome("killed" if preemption.saved is not None else "finished")
    writer.close()  # after summary.json: MLflow uploads it
    say(closing_line(summary))
    jax.block_until_ready(trainer.state.train_state)
    return summary


def _close_failed(writer: AsyncWriter, error: BaseException) -> None:
    """Close the run's writers after ``error``: every record written, the trackers told ``failed`` (or ``killed``)."""
    try:
        writer.set_outcome("killed" if isinstance(error, KeyboardInterrupt) else "failed")
        writer.close()
    except Exception as also:  # the run's own error is the one to raise
        error.add_note(f"Closing the run's writers failed too: {type(also).__name__}: {also}")


def _length(data: Any) -> int | None:
    try:
        return len(data)
    except TypeError:
        return None


def _on_a_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (a bar redrawn in place belongs there, not in a log file)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


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
