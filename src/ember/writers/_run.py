"""`create_run_writer`: the usual writers for a run folder, behind one background thread."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

from ember._run_identity import remember_tracker_run, run_identity, tracker_run
from ember.writers._async import AsyncWriter
from ember.writers._console import ConsoleWriter
from ember.writers._files import CsvWriter, JsonlWriter, writable_folder
from ember.writers._mlflow import MlflowWriter
from ember.writers._multi import MultiWriter
from ember.writers._tensorboard import TensorBoardWriter
from ember.writers._wandb import WandbWriter
from ember.writers._writer import Writer


def _hyperparameters(params: Any) -> Any:
    """A config dataclass as a dict (what W&B and MLflow record); anything else as given."""
    return dataclasses.asdict(params) if dataclasses.is_dataclass(params) and not isinstance(params, type) else params


def _family(params: Any) -> str:
    """The MLflow experiment and W&B project of a run: its config's ``name`` (``ember train``), else ``"ember"``."""
    name = getattr(params, "name", None) if dataclasses.is_dataclass(params) else None
    return name if isinstance(name, str) and name else "ember"


def _wandb(root: Path, params: Any) -> Writer:
    """The run folder's W&B run: its id kept in ``run.json``, so a relaunch continues it."""
    run_id = tracker_run(root, "wandb") or run_identity(root)["id"]
    mode = os.environ.get("WANDB_MODE", "offline")
    config = _hyperparameters(params)
    writer = WandbWriter(_family(params), mode=mode, dir=root, config=config, id=run_id, resume="allow", name=root.name)
    remember_tracker_run(root, "wandb", run_id)
    return writer


def _mlflow(root: Path, params: Any) -> Writer:
    """The run folder's MLflow run, continued by a relaunch; its config and summary uploaded when it closes."""
    make = functools.partial(
        MlflowWriter,
        experiment=_family(params),
        run_name=root.name,
        params=params,
        artifacts=[root / "config.yaml", root / "summary.json"],
    )
    run_id = tracker_run(root, "mlflow")
    if run_id is not None:
        try:
            return make(run_id=run_id)
        except LookupError as e:
            warnings.warn(f"{e} Starting a new MLflow run for {root}.", RuntimeWarning, stacklevel=2)
    writer = make()
    remember_tracker_run(root, "mlflow", writer.run_id)
    return writer


def _wandb_evaluation(root: Path, name: str, params: Any) -> Writer:
    """An evaluation job's own W&B run, grouped with the run's (W&B logs one run from one process)."""
    group = tracker_run(root, "wandb") or run_identity(root)["id"]
    mode = os.environ.get("WANDB_MODE", "offline")
    return WandbWriter(
        _family(params),
        mode=mode,
        dir=root / "eval" / name,
        config=_hyperparameters(params),
        id=f"{group}-eval-{name}",  # the same on a relaunch of the job: it continues its W&B run
        resume="allow",
        name=f"{root.name}/eval/{name}",
        group=group,
    )


def _mlflow_evaluation(root: Path, name: str, params: Any) -> Writer:
    """The run's MLflow run, logged into beside its training job, which owns it (ends it, uploads its files)."""
    run_id = tracker_run(root, "mlflow")
    if run_id is None:
        raise LookupError(f"{root} has no MLflow run in its run.json to log the evaluation {name!r} into.")
    return MlflowWriter(experiment=_family(params), run_id=run_id, own_run=False)


# name -> make(run folder, console stream, hyperparameters)
_MAKERS: dict[str, Callable[[Path, TextIO | None, Any], Writer]] = {
    "console": lambda root, stream, params: ConsoleWriter(stream),
    "tensorboard": lambda root, stream, params: TensorBoardWriter(root / "tb"),
    "jsonl": lambda root, stream, params: JsonlWriter(root / "metrics.jsonl"),
    "csv": lambda root, stream, params: CsvWriter(root / "metrics.csv"),
    "wandb": lambda root, stream, params: _wandb(root.resolve(), params),
    "mlflow": lambda root, stream, params: _mlflow(root.resolve(), params),
}


def _for_evaluation(kind: str, root: Path, name: str, stream: TextIO | None, params: Any) -> Writer:
    """An evaluation job's writer of ``kind``: a tracker's own rule, else the run's maker for ``root/eval/<name>``."""
    if kind == "wandb":
        return _wandb_evaluation(root.resolve(), name, params)
    if kind == "mlflow":
        return _mlflow_evaluation(root.resolve(), name, params)
    return _MAKERS[kind](root / "eval" / name, stream, params)


# name -> make(run folder, evaluation's name, console stream, hyperparameters): an evaluation job's writers
_EVALUATION_MAKERS: dict[str, Callable[[Path, str, TextIO | None, Any], Writer]] = {
    kind: functools.partial(_for_evaluation, kind) for kind in _MAKERS
}


class WriterKinds(Mapping[str, Callable[[Path, TextIO | None, Any], Writer]]):
    """ember's writers by name, in the order a run makes them: what ``create_run_writer`` and ``ember train`` take.

    Each entry makes its writer for a run folder: ``make(run_dir, console_stream, params)``. ``console`` prints a
    line per report; ``tensorboard`` writes ``run_dir/tb``; ``jsonl`` and ``csv`` append to ``run_dir/metrics.*``;
    ``wandb`` logs to a Weights & Biases run (offline unless ``WANDB_MODE`` says otherwise); ``mlflow`` logs to an
    MLflow run (``MLFLOW_TRACKING_URI``) and uploads the run's ``config.yaml`` and ``summary.json`` when it closes.
    Both are named after ``run_dir`` and grouped by the config's ``name`` (the W&B project, the MLflow experiment;
    ``"ember"`` without one), and both keep their run's id in ``run_dir/run.json``: a relaunch continues the same
    tracker run. A new writer is one entry here; ``ember train``'s config lists the same names (a test holds them
    equal).

    Examples:
        >>> from ember.writers import WRITERS
        >>> list(WRITERS)
        ['console', 'tensorboard', 'jsonl', 'csv', 'wandb', 'mlflow']
    """

    def __init__(self, makers: Mapping[str, Callable[[Path, TextIO | None, Any], Writer]]) -> None:
        self._makers = dict(makers)

    def __getitem__(self, name: str) -> Callable[[Path, TextIO | None, Any], Writer]:
        if name not in self._makers:
            raise ValueError(f"No writer is named {name!r}; the writers are {list(self._makers)}.")
        return self._makers[name]

    def __contains__(self, name: object) -> bool:
        return name in self._makers

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


WRITERS = WriterKinds(_MAKERS)


def create_run_writer(
    run_dir: str | os.PathLike[str],
    writers: Iterable[str] = ("console", "tensorboard", "jsonl"),
    *,
    stream: TextIO | None = None,
    params: Any = None,
    primary_only: bool = True,
    evaluation: str | None = None,
) -> AsyncWriter:
    """An ``AsyncWriter`` over the writers named (from [`WRITERS`][ember.writers.WRITERS]) for a run folder.

    Args:
        run_dir: the run's folder (created on the primary process).
        writers: names from ``WRITERS``: ``console``, ``tensorboard`` (``run_dir/tb``), ``jsonl``
            (``run_dir/metrics.jsonl``), ``csv`` (``run_dir/metrics.csv``), ``wandb``, ``mlflow``; made in
            ``WRITERS``' order whatever the order given.
        stream: where ``console`` prints (standard output by default).
        params: hyperparameters for MLflow and W&B (a mapping, or ``ember train``'s config).
        primary_only: only process 0 writes (and creates files).
        evaluation: the writers of a job that evaluates the run from outside it, under this name (``ember eval
            --watch``), beside the training job's: ``jsonl``, ``csv`` and ``tensorboard`` write into
            ``run_dir/eval/<evaluation>/`` (``metrics.jsonl``, ``metrics.csv``, ``tb``); ``mlflow`` logs into the
            run's own MLflow run (its id in ``run.json``), which the training job keeps owning (this writer never
            ends it); ``wandb`` logs to a W&B run of its own, ``<run id>-eval-<evaluation>``, in the W&B group of
            the run's (W&B takes one run's records from one process).

    Examples:
        >>> import tempfile, os
        >>> from ember.writers import create_run_writer
        >>> run = tempfile.mkdtemp()
        >>> w = create_run_writer(run, ["jsonl", "csv", "tensorboard"])
        >>> w.write_scalars(1, {"loss": 0.5}); w.close()
        >>> sorted(os.listdir(run))
        ['metrics.csv', 'metrics.jsonl', 'tb']
        >>> w = create_run_writer(run, ["jsonl", "tensorboard"], evaluation="val_noisy")
        >>> w.write_scalars(5, {"val_noisy/val/accuracy": 0.9}); w.close()
        >>> sorted(os.listdir(os.path.join(run, "eval", "val_noisy")))
        ['metrics.jsonl', 'tb']
    """
    if isinstance(writers, str):
        raise TypeError(f"`writers` must be a list of names from {list(WRITERS)}, got the string {writers!r}.")
    chosen = list(writers)
    unknown = [name for name in chosen if name not in WRITERS]
    if unknown:
        raise ValueError(f"`writers` names {unknown}, which are not writers; the writers are {list(WRITERS)}.")
    if evaluation is not None and not (isinstance(evaluation, str) and re.fullmatch(r"[A-Za-z0-9_.-]+", evaluation)):
        raise ValueError(f"`evaluation` must be a name of letters, digits, '_', '.' and '-', got {evaluation!r}.")
    writer = AsyncWriter(MultiWriter([]), primary_only=primary_only)
    if not writer.active:
        return writer
    root = writable_folder(run_dir, "run_dir", "create_run_writer")
    if evaluation is None:
        made = [make(root, stream, params) for name, make in WRITERS.items() if name in chosen]
    else:
        made = [make(root, evaluation, stream, params) for name, make in _EVALUATION_MAKERS.items() if name in chosen]
    writer.writer = MultiWriter(made)
    return writer
