"""`ember train`: build a run from a config, train it with the stock handlers, resume it if it was started."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import jax
import optax

from ember import Events
from ember.cli._config import Config, dump_config, load_config
from ember.cli._registry import build_model, build_optimizer, build_schedule, load_data
from ember.data import ArrayDataset
from ember.handlers import (
    Checkpoint,
    EarlyStopping,
    Evaluate,
    LRMonitor,
    Preemption,
    ProgressBar,
    ScalarLogger,
    global_step_from_engine,
)
from ember.metrics import Accuracy, Loss, RunningAverage
from ember.training import DataParallel, Pmap, SingleDevice, TrainState, create_evaluator, create_trainer
from ember.writers import AsyncWriter, ConsoleWriter, CsvWriter, JsonlWriter, MultiWriter, TensorBoardWriter, Writer

PLACEMENTS = {"single": SingleDevice, "data_parallel": DataParallel, "pmap": Pmap}


def _loss(model: Any, batch: Any) -> Any:
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), {"y_pred": logits}


def _predict(model: Any, batch: Any) -> Any:
    return {"y_pred": model(batch["x"]), "y": batch["y"]}


def _writers(config: Config, run_dir: Path, stream: TextIO | None) -> AsyncWriter:
    made: list[Writer] = []
    for kind in config.handlers.writers:
        if kind == "console":
            made.append(ConsoleWriter(stream))
        elif kind == "tensorboard":
            made.append(TensorBoardWriter(run_dir / "tb"))
        elif kind == "jsonl":
            made.append(JsonlWriter(run_dir / "metrics.jsonl"))
        else:
            made.append(CsvWriter(run_dir / "metrics.csv"))
    return AsyncWriter(MultiWriter(made))


def train(
    config: Config | str | Path | dict[str, Any] | None = None,
    *,
    stream: TextIO | None = None,
    progress_stream: TextIO | None = None,
) -> dict[str, Any]:
    """Train as ``config`` says, in ``config.output``; resume there if the run was started before.

    The run folder gets ``config.yaml``, ``checkpoints/latest`` and ``checkpoints/best``, TensorBoard
    files under ``tb/``, ``metrics.jsonl``, and ``summary.json``. Running the same config again resumes
    from the latest checkpoint (a finished run has nothing left to do and says so).

    Returns:
        The summary: ``{"run_dir", "resumed_from", "epochs", "iterations", "best_accuracy",
        "final_accuracy", "stopped_early", "seconds"}``.

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
    out = stream or sys.stdout
    run_dir = Path(cfg.output)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    started = time.perf_counter()

    train_arrays, val_arrays = load_data(cfg.data)
    data = ArrayDataset(
        train_arrays, batch_size=cfg.data.batch_size, shuffle=True, seed=cfg.data.seed, drop_remainder=True
    )
    val = ArrayDataset(val_arrays, batch_size=len(val_arrays["y"]))
    steps_per_epoch = len(data)
    total = cfg.trainer.max_iters or cfg.trainer.max_epochs * steps_per_epoch
    schedule = build_schedule(cfg.optimizer, total)
    model = build_model(cfg.model)
    state = TrainState.from_linen(
        model, train_arrays["x"][:1], build_optimizer(cfg.optimizer, schedule), seed=cfg.trainer.seed, rngs=("dropout",)
    )
    placement = None if cfg.trainer.placement == "auto" else PLACEMENTS[cfg.trainer.placement]()
    trainer = create_trainer(state, _loss, placement=placement, steps_per_call=cfg.trainer.steps_per_call)
    evaluator = create_evaluator(trainer, _predict, placement=trainer.placement)
    Accuracy().attach(evaluator, "accuracy")
    Loss(optax.softmax_cross_entropy_with_integer_labels).attach(evaluator, "loss")
    RunningAverage(output_transform=lambda o: o["loss"]).attach(trainer, "loss")

    writer = _writers(cfg, run_dir, out)
    h = cfg.handlers
    ScalarLogger(writer, tag="train", metric_names=["loss"]).attach(
        trainer, Events.ITERATION_COMPLETED(every=h.log_every)
    )
    LRMonitor(writer, schedule=schedule, tag="train/lr").attach(trainer, Events.ITERATION_COMPLETED(every=h.log_every))
    Evaluate(evaluator, val, writer=writer, tag="val").attach(
        trainer, Events.EPOCH_COMPLETED(every=cfg.trainer.eval_every)
    )
    if h.progress:
        ProgressBar(refresh_every=10, stream=progress_stream, desc="Epoch").attach(trainer, metric_names=["loss"])
    to_save: dict[str, Any] = {"trainer": trainer, "data": data}
    stopper = None
    if h.early_stopping is not None:
        es = h.early_stopping
        stopper = EarlyStopping(
            es.patience,
            lambda e: e.state.metrics[es.metric],
            trainer,
            min_delta=es.min_delta,
            mode="max" if es.metric == "accuracy" else "min",
        )
        stopper.attach(evaluator)
        to_save["early_stopping"] = stopper
    best = Checkpoint(
        to_save,
        run_dir / "checkpoints" / "best",
        keep_latest=None,
        keep_best=h.checkpoint.keep_best,
        score_fn=lambda e: e.state.metrics["accuracy"],
        score_name="val_accuracy",
        step_fn=global_step_from_engine(trainer),
    )
    best.attach(evaluator, Events.COMPLETED)
    latest = Checkpoint(to_save, run_dir / "checkpoints" / "latest", keep_latest=h.checkpoint.keep_latest)
    every = Events.EPOCH_COMPLETED | Events.COMPLETED
    if h.checkpoint.every_iters:
        every = every | Events.ITERATION_COMPLETED(every=h.checkpoint.every_iters)
    latest.attach(trainer, every)
    Preemption(latest).attach(trainer, [evaluator])

    accuracies: list[float] = []
    evaluator.add_event_handler(Events.COMPLETED, lambda e: accuracies.append(float(e.state.metrics["accuracy"])))
    evaluator.add_event_handler(
        Events.COMPLETED,
        lambda e: print(
            f"epoch {trainer.state.epoch:3d}  iteration {trainer.state.iteration:5d}  "
            f"val accuracy {e.state.metrics['accuracy']:.4f}  val loss {e.state.metrics['loss']:.4f}",
            file=out,
        ),
    )

    info = latest.resume()
    if info is not None:
        print(f"Resuming {run_dir} from {info.path.name} (iteration {info.step}).", file=out)
    if info is not None and _finished(trainer, cfg, stopper):
        print(f"{run_dir}: this run is already complete; nothing to do.", file=out)
    elif cfg.trainer.max_iters is not None:
        trainer.run(data, max_iters=cfg.trainer.max_iters)
    else:
        trainer.run(data, max_epochs=cfg.trainer.max_epochs)
    writer.close()
    best_info = best.store.best("val_accuracy")
    summary = {
        "run_dir": str(run_dir),
        "resumed_from": None if info is None else info.step,
        "epochs": trainer.state.epoch,
        "iterations": trainer.state.iteration,
        "best_accuracy": None if best_info is None else best_info.metrics["val_accuracy"],
        "final_accuracy": accuracies[-1] if accuracies else None,
        "stopped_early": bool(stopper is not None and stopper.counter >= stopper.patience),
        "seconds": round(time.perf_counter() - started, 2),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(
        f"Done: {summary['epochs']} epochs, {summary['iterations']} iterations in {summary['seconds']} s; "
        f"best val accuracy {summary['best_accuracy']}. Run folder: {run_dir}",
        file=out,
    )
    jax.block_until_ready(trainer.state.train_state)
    return summary


def _finished(trainer: Any, cfg: Config, stopper: EarlyStopping | None) -> bool:
    st = trainer.state
    if stopper is not None and stopper.counter >= stopper.patience:
        return True
    if cfg.trainer.max_iters is not None:
        return st.iteration >= cfg.trainer.max_iters
    return st.epoch_length is not None and st.iteration >= st.epoch_length * cfg.trainer.max_epochs
