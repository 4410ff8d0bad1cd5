"""`ember train`: build a run from a config, train it with the stock handlers, resume it if it was started."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO

import jax

from ember._multiprocess import exchange
from ember._run_holder import hold
from ember.cli._config import Config, config_source, importable, load_config
from ember.cli._early_signals import stop_if_signalled
from ember.cli._run_checkpoints import close_stores, fast_tier
from ember.cli._run_course import finished, skipped_line, why_stopped
from ember.cli._run_parts import Console, Engines, Handlers, attach_handlers, build_engines, use_compilation_cache
from ember.cli._run_record import check_same_run, closing_line, saved_summary
from ember.writers import AsyncWriter


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

    One launch writes a run folder at a time: while another live launch holds it (``held-by.json``: its host,
    process id and since when), this one raises [`RunHeldError`][ember.errors.RunHeldError] before it writes
    anything; a launch that died (SIGKILL, a lost machine) never blocks the relaunch.

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
    source = _models_importable(config, source)
    console = Console.open(cfg, stream, progress_stream)
    run_dir = Path(cfg.output)
    fast_tier(cfg.handlers.checkpoint, run_dir)  # a mistaken fast folder refused before the run folder is made
    with hold(run_dir, "run"):  # one launch writes a run folder at a time; a second is refused here
        return _held(cfg, run_dir, source, console)


def _held(cfg: Config, run_dir: Path, source: str | Path | None, console: Console) -> dict[str, Any]:
    """`train` once this launch holds the run folder."""
    stop_if_signalled()  # a Ctrl-C or SIGTERM noted as JAX imported (ember's command line): stopped, nothing written
    new_layout = check_same_run(run_dir, cfg)
    started = time.perf_counter()
    use_compilation_cache(cfg.trainer.compilation_cache)
    engines = build_engines(cfg, run_dir, source, console)
    stop_if_signalled()  # ... as the data loaded and the model was built
    handlers = attach_handlers(cfg, engines, run_dir, console)
    try:
        info = _resumed(handlers, run_dir, new_layout, console)
        stop_if_signalled()  # ... as the checkpoint was read: the last safe point before Preemption takes them over
        if info is not None and finished(engines.trainer, cfg):
            previous = _already_complete(handlers, run_dir, console)
            if previous is not None:  # the record of the run stays as the run left it
                return previous
        else:
            _run(cfg, engines, handlers.writer, info, relaunched=engines.relaunched)
    except BaseException as error:  # the trackers record the run as failed (killed: Ctrl-C) with every record kept
        _close_failed(handlers.writer, error)
        raise
    resumed_from = None if info is None else info.step
    return _concluded(cfg, engines, handlers, run_dir, resumed_from, started, console)


def _models_importable(config: Any, source: str | Path | None) -> str | Path | None:
    """The config file's folder (``source``, or the file's own) and the working directory put on ``sys.path``.

    A model given as ``"mymodels:Net"`` may sit beside the (original) config file, or where the command runs.
    """
    if source is None and isinstance(config, str | Path):
        source = config_source(config)
    if source is not None:
        importable(source)
    importable(Path.cwd())
    return source


def _resumed(handlers: Handlers, run_dir: Path, new_layout: list[str], console: Console) -> Any:
    """The latest checkpoint restored into the run (said on the console), or ``None`` for a run starting afresh."""
    info = handlers.latest.resume()
    if info is not None:
        console.say(f"Resuming {run_dir} from {info.path.name} (iteration {info.step}).")
        if new_layout:
            console.say(f"Restored onto a new layout ({'; '.join(new_layout)}).")
    return info


def _already_complete(handlers: Handlers, run_dir: Path, console: Console) -> dict[str, Any] | None:
    """Say the run is complete; with its saved summary, close its records and say its closing line, and return it."""
    console.say(f"{run_dir}: this run is already complete; nothing to do.")
    previous = saved_summary(run_dir)
    if previous is not None:
        handlers.writer.close()
        close_stores(handlers.best, handlers.latest)
        console.say(closing_line(previous))
    return previous


def _run(cfg: Config, engines: Engines, writer: AsyncWriter, info: Any, *, relaunched: bool) -> None:
    """Train from where the run stands (``info``: the checkpoint resumed, or ``None``) to its end."""
    if info is not None:  # the logs of steps past the checkpoint are dropped: the resumed run logs them again
        writer.resume_at(info.step)
    elif relaunched:  # killed before its first checkpoint, the run starts over, and so does its record
        writer.resume_at(0)
    length = cfg.data.epoch_length
    if cfg.trainer.max_iters is not None:
        engines.trainer.run(engines.data, max_iters=cfg.trainer.max_iters, epoch_length=length)
    else:
        engines.trainer.run(engines.data, max_epochs=cfg.trainer.max_epochs, epoch_length=length)


def _concluded(
    cfg: Config,
    engines: Engines,
    handlers: Handlers,
    run_dir: Path,
    resumed_from: int | None,
    started: float,
    console: Console,
) -> dict[str, Any]:
    """The run's summary, written to ``summary.json``, its records closed, and its closing lines printed."""
    trainer, best = engines.trainer, handlers.best
    close_stores(best, handlers.latest)  # their writer threads end with the run (a notebook runs many)
    if jax.process_count() > 1:  # process 0 has written every checkpoint: all read the same best
        exchange("ember train: checkpoints written", "")  # bounded: a process that does not come is named
    scored = f"{cfg.handlers.checkpoint.best_on}_accuracy"  # the best checkpoints' score: val's, or an evaluation's
    best_info = best.store.best(scored) if best.store is not None else None
    stopper, nan_guard, skip_limit = handlers.stopper, handlers.nan_guard, handlers.skip_limit
    stopped = why_stopped(trainer, handlers.preemption, stopper, nan_guard, skip_limit)
    es = cfg.handlers.early_stopping
    if stopped == "early stopping" and stopper is not None and es is not None:
        console.say(
            f"Early stopping: val {es.metric} did not improve for {stopper.patience} evaluations; stopped at "
            f"epoch {trainer.state.epoch}."
        )
    elif stopped == "a NaN loss":
        console.say(f"Stopped: the training loss became NaN or infinite at iteration {nan_guard.nan_iteration}.")
    elif stopped == "skipped updates":
        console.say(skipped_line(trainer, skip_limit))
    summary = {
        "run_dir": str(run_dir),
        "resumed_from": resumed_from,
        "epochs": trainer.state.epoch,
        "iterations": trainer.state.iteration,
        "best_accuracy": None if best_info is None else best_info.metrics[scored],
        "best_on": cfg.handlers.checkpoint.best_on,
        "final_accuracy": handlers.last.metrics.get("accuracy"),
        "stopped_early": stopped == "early stopping",
        "stopped": stopped,
        "seconds": round(time.perf_counter() - started, 2),
    }
    if console.primary:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    # a signal stopped it: "killed" (MLflow KILLED), and the relaunch continues the same tracker run
    handlers.writer.set_outcome("killed" if handlers.preemption.saved is not None else "finished")
    handlers.writer.close()  # after summary.json: MLflow uploads it
    console.say(closing_line(summary))
    jax.block_until_ready(trainer.state.train_state)
    return summary


def _close_failed(writer: AsyncWriter, error: BaseException) -> None:
    """Close the run's writers after ``error``: every record written, the trackers told ``failed`` (or ``killed``)."""
    try:
        writer.set_outcome("killed" if isinstance(error, KeyboardInterrupt) else "failed")
        writer.close()
    except Exception as also:  # the run's own error is the one to raise
        error.add_note(f"Closing the run's writers failed too: {type(also).__name__}: {also}")
