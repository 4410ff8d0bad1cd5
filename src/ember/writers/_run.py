"""`create_run_writer`: the usual writers for a run folder, behind one background thread."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, TextIO

from ember.writers._async import AsyncWriter
from ember.writers._console import ConsoleWriter
from ember.writers._files import CsvWriter, JsonlWriter
from ember.writers._mlflow import MlflowWriter
from ember.writers._multi import MultiWriter
from ember.writers._tensorboard import TensorBoardWriter
from ember.writers._wandb import WandbWriter
from ember.writers._writer import Writer


def create_run_writer(
    run_dir: str | os.PathLike[str],
    *,
    console: bool | TextIO = True,
    tensorboard: bool = True,
    jsonl: bool = True,
    csv: bool = False,
    mlflow: bool = False,
    wandb: bool = False,
    params: Any = None,
    primary_only: bool = True,
) -> AsyncWriter:
    """An ``AsyncWriter`` over the chosen writers: ``run_dir/tb``, ``run_dir/metrics.jsonl``, ``.csv``.

    Args:
        run_dir: the run's folder (created on the primary process).
        console: print a line per report (``True``: standard output; or a stream).
        tensorboard: write TensorBoard event files under ``run_dir/tb``.
        jsonl: append to ``run_dir/metrics.jsonl``.
        csv: append to ``run_dir/metrics.csv``.
        mlflow: log to an MLflow run too (``MLFLOW_TRACKING_URI``; the experiment is named after ``run_dir``,
            whose files are uploaded at the end).
        wandb: log to a Weights & Biases run too (offline unless ``WANDB_MODE`` says otherwise; the project is
            named after ``run_dir``, its files under ``run_dir/wandb``).
        params: hyperparameters for MLflow and W&B (a mapping, or ``ember train``'s config).
        primary_only: only process 0 writes (and creates files).

    Examples:
        >>> import tempfile, os
        >>> from ember.writers import create_run_writer
        >>> run = tempfile.mkdtemp()
        >>> w = create_run_writer(run, console=False, csv=True)
        >>> w.write_scalars(1, {"loss": 0.5}); w.close()
        >>> sorted(os.listdir(run))
        ['metrics.csv', 'metrics.jsonl', 'tb']
    """
    writer = AsyncWriter(MultiWriter([]), primary_only=primary_only)
    if not writer.active:
        return writer
    root = Path(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    writers: list[Writer] = []
    if console is not False:
        writers.append(ConsoleWriter(None if console is True else console))
    if tensorboard:
        writers.append(TensorBoardWriter(root / "tb"))
    if jsonl:
        writers.append(JsonlWriter(root / "metrics.jsonl"))
    if csv:
        writers.append(CsvWriter(root / "metrics.csv"))
    if wandb:
        config: Any = params
        if dataclasses.is_dataclass(params) and not isinstance(params, type):
            config = dataclasses.asdict(params)
        mode = os.environ.get("WANDB_MODE", "offline")
        writers.append(WandbWriter(root.resolve().name, mode=mode, dir=root, config=config))
    if mlflow:  # last: it uploads the run folder when it closes, after the others have flushed their files
        writers.append(MlflowWriter(experiment=root.resolve().name, params=params, artifacts=root))
    writer.writer = MultiWriter(writers)
    return writer
