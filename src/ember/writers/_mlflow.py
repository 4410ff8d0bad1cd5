"""`MlflowWriter`: a run in an MLflow tracking store (an optional extra)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ember._extras import missing
from ember.writers._writer import Writer, check_outcome


def flat_settings(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings under dotted names, the leaves as they are (MLflow's params, TensorBoard's HParams).

    Examples:
        >>> from ember.writers._mlflow import flat_settings
        >>> flat_settings({"optimizer": {"lr": 0.001, "schedule": None}, "name": "digits"})
        {'optimizer.lr': 0.001, 'optimizer.schedule': None, 'name': 'digits'}
    """
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_settings(value, f"{name}."))
        else:
            out[name] = value
    return out


_STATUS = {"finished": "FINISHED", "failed": "FAILED", "killed": "KILLED"}


class MlflowWriter(Writer):
    """Logs to an MLflow run: params at the start, metrics with their steps, chosen files at the end.

    Scalars become MLflow metrics at their step; text and images become artifacts under their name and step
    (``loss_curve/step_00000100.png``); MLflow has no histograms, so those are not logged. ``params`` (a
    mapping, or a dataclass such as ``ember train``'s ``Config``) is logged flat, with dotted names
    (``optimizer.learning_rate``). At [`close`][ember.writers.MlflowWriter.close] the ``artifacts`` are uploaded and
    the run is given its status: ``FINISHED``, or ``FAILED`` / ``KILLED`` as
    [`set_outcome`][ember.writers.Writer.set_outcome] said. Install with ``pip install -e ".[mlflow]"``.

    A relaunch continues the same run when given its ``run_id`` (``create_run_writer`` keeps it in the run folder's
    ``run.json``): the run is ``RUNNING`` again, params it has keep their first value (a changed one is recorded as
    the tag ``ember.relaunch.<name>``), and after [`resume_at`][ember.writers.MlflowWriter.resume_at] the points the
    earlier launch already logged past the resumed step are not logged twice (MLflow cannot delete points; ember's
    resume is exact, so they are the values the relaunch computes).

    Args:
        tracking_uri: the tracking store (``sqlite:///mlflow.db``, a server's URL, a folder); MLflow's default
            (``MLFLOW_TRACKING_URI``) when ``None``.
        experiment: the experiment's name; created if missing.
        run_name: the run's name.
        params: hyperparameters to log at the start.
        artifacts: files or folders (a folder's files) to upload when the run closes; one path or several.
        run_id: an existing run to continue instead of starting one.
        own_run: whether this writer owns the run it logs to (by default). ``False`` (with ``run_id``): another job
            owns it, as an evaluation job logging beside the training job into its run (``ember eval --watch``):
            opening leaves its status alone, and closing uploads nothing and does not end it.

    Examples:
        >>> import os, tempfile
        >>> from ember.writers import MlflowWriter
        >>> os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 keeps its folder store for local use
        >>> w = MlflowWriter(f"file://{tempfile.mkdtemp()}", params={"optimizer": {"lr": 0.1}})
        >>> w.write_scalars(1, {"loss": 0.5}); w.write_scalars(2, {"loss": 0.25}); w.close()
        >>> run = w.client.get_run(w.run_id)
        >>> run.data.params, run.data.metrics, run.info.status
        ({'optimizer.lr': '0.1'}, {'loss': 0.25}, 'FINISHED')
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        experiment: str = "ember",
        run_name: str | None = None,
        params: Any = None,
        artifacts: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
        run_id: str | None = None,
        own_run: bool = True,
    ) -> None:
        try:
            from mlflow.entities import Metric, Param, RunTag
            from mlflow.exceptions import MlflowException
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise ImportError(missing("MlflowWriter", "mlflow", "mlflow")) from e
        if params is not None and dataclasses.is_dataclass(params) and not isinstance(params, type):
            params = dataclasses.asdict(params)
        if params is not None and not isinstance(params, Mapping):
            raise TypeError(f"`params` must be a mapping or a dataclass instance, got {type(params).__name__}.")
        if not own_run and run_id is None:
            raise ValueError("`own_run=False` logs into another job's run: give its `run_id`.")
        self.own_run = own_run
        self._metric, self._param, self._tag = Metric, Param, RunTag
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.artifacts = _paths(artifacts)
        self._step = 0
        self._logged: dict[str, set[int]] = {}  # after resume_at: the points an earlier launch logged past it
        self._status = "FINISHED"
        if run_id is None:
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
            self.run_id: str = self.client.create_run(experiment_id, run_name=run_name).info.run_id
            if params:
                self._log_params(params)
            return
        try:
            run = self.client.get_run(run_id)
        except MlflowException as e:
            raise LookupError(
                f"`run_id` {run_id!r} names no run in the tracking store {self.client.tracking_uri}; give the store "
                "that holds it (tracking_uri, MLFLOW_TRACKING_URI), or run_id=None to start a new run."
            ) from e
        self.run_id = run_id
        if own_run:
            self.client.update_run(run_id, status="RUNNING")
        if params:
            self._log_params(params, kept=run.data.params)

    def _log_params(self, params: Mapping[str, Any], kept: Mapping[str, str] | None = None) -> None:
        """Log ``params``; those already in the run (``kept``) are not logged again, a changed one becomes a tag."""
        flat = {k: str(v) for k, v in flat_settings(params).items()}  # MLflow's params are text
        kept = kept or {}
        new = [self._param(k, v) for k, v in flat.items() if k not in kept]
        changed = [self._tag(f"ember.relaunch.{k}", v) for k, v in flat.items() if k in kept and kept[k] != v]
        self.client.log_batch(self.run_id, params=new, tags=changed)

    def write_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Each value as an MLflow metric at ``step`` (unless an earlier launch of the run logged it there)."""
        now = int(time.time() * 1000)
        self._step = int(step)
        metrics = [
            self._metric(name, float(value), now, int(step))
            for name, value in values.items()
            if int(step) not in self._logged.setdefault(name, set())
        ]
        for name in values:  # a point is logged once: write_hparams' final metrics at a step already logged are not
            self._logged[name].add(int(step))
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def resume_at(self, step: int) -> None:
        """The run goes on from ``step``: the points the run already holds past it are not logged again."""
        metrics = self.client.get_run(self.run_id).data.metrics
        self._logged = {
            name: {m.step for m in self.client.get_metric_history(self.run_id, name) if m.step > step}
            for name in metrics
        }

    def write_image(self, step: int, name: str, image: Any) -> None:
        """A PNG artifact ``name/step_NNNNNNNN.png`` (needs Pillow: the ``plots`` extra)."""
        self.client.log_image(self.run_id, np.asarray(image), artifact_file=f"{name}/step_{int(step):08d}.png")

    def write_text(self, step: int, name: str, text: str) -> None:
        """A text artifact ``name/step_NNNNNNNN.txt``."""
        self.client.log_text(self.run_id, text, f"{name}/step_{int(step):08d}.txt")

    def write_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, float] | None = None) -> None:
        """The hyperparameters as params; final ``metrics`` at the last step written (but not twice at one step)."""
        self._log_params(hparams, kept=self.client.get_run(self.run_id).data.params)
        if metrics:
            self.write_scalars(self._step, metrics)

    def set_outcome(self, outcome: str) -> None:
        """The status the run closes with: ``FINISHED``, ``FAILED`` or ``KILLED``."""
        self._status = _STATUS[check_outcome(outcome)]

    def close(self) -> None:
        """Upload the ``artifacts`` that exist, then end the run with its status (a run it does not own: nothing)."""
        if not self.own_run:
            return
        for path in self.artifacts:
            if path.is_dir():
                self.client.log_artifacts(self.run_id, str(path))
            elif path.is_file():
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, self._status)


def _paths(artifacts: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None) -> list[Path]:
    if artifacts is None:
        return []
    if isinstance(artifacts, str | os.PathLike):
        return [Path(artifacts)]
    return [Path(a) for a in artifacts]
