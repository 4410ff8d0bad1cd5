"""`MlflowWriter`: a run in an MLflow tracking store (an optional extra)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ember._extras import missing
from ember.writers._writer import Writer


def _flat(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested settings as MLflow params: dotted names, values as text."""
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = str(value)
    return out


class MlflowWriter(Writer):
    """Logs to an MLflow run: params at the start, metrics with their steps, a folder's files at the end.

    Scalars become MLflow metrics at their step; text and images become artifacts under their name and step
    (``loss_curve/step_00000100.png``); MLflow has no histograms, so those are not logged. ``params`` (a
    mapping, or a dataclass such as ``ember train``'s ``Config``) is logged flat, with dotted names
    (``optimizer.learning_rate``). At [`close`][ember.writers.MlflowWriter.close] the files of ``artifacts``
    (a run folder) are uploaded and the run is marked finished. Install with ``pip install -e ".[mlflow]"``.

    Args:
        tracking_uri: the tracking store (``sqlite:///mlflow.db``, a server's URL, a folder); MLflow's default
            (``MLFLOW_TRACKING_URI``) when ``None``.
        experiment: the experiment's name; created if missing.
        run_name: the run's name.
        params: hyperparameters to log at the start.
        artifacts: a folder whose files are logged as the run's artifacts when it closes.

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
        artifacts: str | os.PathLike[str] | None = None,
    ) -> None:
        try:
            from mlflow.entities import Metric, Param
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise ImportError(missing("MlflowWriter", "mlflow", "mlflow")) from e
        if params is not None and dataclasses.is_dataclass(params) and not isinstance(params, type):
            params = dataclasses.asdict(params)
        if params is not None and not isinstance(params, Mapping):
            raise TypeError(f"`params` must be a mapping or a dataclass instance, got {type(params).__name__}.")
        self._metric, self._param = Metric, Param
        self.client = MlflowClient(tracking_uri=tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        self.run_id: str = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        self.artifacts = None if artifacts is None else Path(artifacts)
        self._step = 0
        if params:
            self._log_params(params)

    def _log_params(self, params: Mapping[str, Any]) -> None:
        self.client.log_batch(self.run_id, params=[self._param(k, v) for k, v in _flat(params).items()])

    def write_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Each value as an MLflow metric at ``step``."""
        now = int(time.time() * 1000)
        self._step = int(step)
        metrics = [self._metric(name, float(value), now, int(step)) for name, value in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def write_image(self, step: int, name: str, image: Any) -> None:
        """A PNG artifact ``name/step_NNNNNNNN.png`` (needs Pillow: the ``plots`` extra)."""
        self.client.log_image(self.run_id, np.asarray(image), artifact_file=f"{name}/step_{int(step):08d}.png")

    def write_text(self, step: int, name: str, text: str) -> None:
        """A text artifact ``name/step_NNNNNNNN.txt``."""
        self.client.log_text(self.run_id, text, f"{name}/step_{int(step):08d}.txt")

    def write_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, float] | None = None) -> None:
        """The hyperparameters as params; final ``metrics`` as metrics at the last step written."""
        self._log_params(hparams)
        if metrics:
            self.write_scalars(self._step, metrics)

    def close(self) -> None:
        """Upload the ``artifacts`` folder's files, then mark the run finished."""
        if self.artifacts is not None and self.artifacts.is_dir():
            self.client.log_artifacts(self.run_id, str(self.artifacts))
        self.client.set_terminated(self.run_id)
