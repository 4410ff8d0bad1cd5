"""`create_run_writer`: the usual writers for a run folder, behind one background thread."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
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


def _hyperparameters(params: Any) -> Any:
    """A config dataclass as a dict (what W&B and MLflow record); anything else as given."""
    return dataclasses.asdict(params) if dataclasses.is_dataclass(params) and not isinstance(params, type) else params


# name -> make(run folder, console stream, hyperparameters)
_MAKERS: dict[str, Callable[[Path, TextIO | None, Any], Writer]] = {
    "console": lambda root, stream, params: ConsoleWriter(stream),
    "tensorboard": lambda root, stream, params: TensorBoardWriter(root / "tb"),
    "jsonl": lambda root, stream, params: JsonlWriter(root / "metrics.jsonl"),
    "csv": lambda root, stream, params: CsvWriter(root / "metrics.csv"),
    "wandb": lambda root, stream, params: WandbWriter(
        root.resolve().name, mode=os.environ.get("WANDB_MODE", "offline"), dir=root, config=_hyperparameters(params)
    ),
    # last: it uploads the run folder when it closes, after the others have flushed their files
    "mlflow": lambda root, stream, params: MlflowWriter(experiment=root.resolve().name, params=params, artifacts=root),
}


class WriterKinds(Mapping[str, Callable[[Path, TextIO | None, Any], Writer]]):
    """ember's writers by name, in the order a run makes them: what ``create_run_writer`` and ``ember train`` take.

    Each entry makes its writer for a run folder: ``make(run_dir, console_stream, params)``. ``console`` prints a
    line per report; ``tensorboard`` writes ``run_dir/tb``; ``jsonl`` and ``csv`` append to ``run_dir/metrics.*``;
    ``wandb`` logs to a Weights & Biases run (offline unless ``WANDB_MODE`` says otherwise; the project is named
    after ``run_dir``); ``mlflow`` logs to an MLflow run (``MLFLOW_TRACKING_URI``) and uploads the run folder at the
    end. A new writer is one entry here; ``ember train``'s config lists the same names (a test holds them equal).

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

    Examples:
        >>> import tempfile, os
        >>> from ember.writers import create_run_writer
        >>> run = tempfile.mkdtemp()
        >>> w = create_run_writer(run, ["jsonl", "csv", "tensorboard"])
        >>> w.write_scalars(1, {"loss": 0.5}); w.close()
        >>> sorted(os.listdir(run))
        ['metrics.csv', 'metrics.jsonl', 'tb']
    """
    if isinstance(writers, str):
        raise TypeError(f"`writers` must be a list of names from {list(WRITERS)}, got the string {writers!r}.")
    chosen = list(writers)
    unknown = [name for name in chosen if name not in WRITERS]
    if unknown:
        raise ValueError(f"`writers` names {unknown}, which are not writers; the writers are {list(WRITERS)}.")
    writer = AsyncWriter(MultiWriter([]), primary_only=primary_only)
    if not writer.active:
        return writer
    root = Path(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    writer.writer = MultiWriter([make(root, stream, params) for name, make in WRITERS.items() if name in chosen])
    return writer
