"""`WandbWriter`: Weights & Biases, online or offline (an optional extra)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ember._extras import missing
from ember.writers._histogram import Histogram, histogram
from ember.writers._writer import Writer, check_outcome

_EXIT_CODES = {"finished": 0, "failed": 1, "killed": 130}

# W&B's own process writes the run's file (offline) on this timer, 15 s by default; WANDB__TRANSACTION_LOG_... sets it
_FLUSH_SETTING = "x_transaction_log_flush_interval"
_FLUSH_ENV = "WANDB__TRANSACTION_LOG_FLUSH_INTERVAL"


class WandbWriter(Writer):
    """Logs to a Weights & Biases run; ``mode="offline"`` (the default here) writes locally, for ``wandb sync``.

    Scalars go to ``run.log(values, step=step)``; histograms and images become ``wandb.Histogram`` and ``wandb.Image``;
    text is logged as a string; hyperparameters go to the run's config and final metrics to its summary. The run
    finishes with the exit code of [`set_outcome`][ember.writers.WandbWriter.set_outcome] (0 unless told). A relaunch
    continues a run with ``id=`` its id and ``resume="allow"`` (``create_run_writer`` keeps the id in the run folder's
    ``run.json``); W&B keeps one history row per step, the first, so the steps an earlier launch logged past the
    resumed checkpoint are not logged twice (ember's resume is exact: they hold the same values). Values written
    at the same step (training loss and validation metrics at iteration 100) merge into one row, which W&B commits when
    a later step arrives or at [`close`][ember.writers.WandbWriter.close]. W&B drops values for a step below the last
    one committed (with a warning of its own), so give every writer the trainer's iteration as its step. Install with
    ``pip install -e ".[wandb]"`` in a clone of ember.

    Args:
        project: the W&B project.
        mode: ``"offline"``, ``"online"`` or ``"disabled"``.
        dir: where W&B keeps its files (the run folder, say).
        config: hyperparameters to record at the start.
        flush_secs: how often W&B's own process writes what it was given to the run's file (W&B's
            ``x_transaction_log_flush_interval``, 15 s unless set; ``settings=`` or the environment's
            ``WANDB__TRANSACTION_LOG_FLUSH_INTERVAL`` take precedence). W&B cannot be asked to write sooner, so a
            SIGKILL loses at most this much of its history: the steps the relaunch resumes past are logged again,
            those before its checkpoint are in the run's JSONL.
        init_kwargs: anything else ``wandb.init`` takes (``name``, ``tags``, ``entity``, ``settings``...).

    Examples:
        >>> import tempfile
        >>> from ember.writers import WandbWriter
        >>> w = WandbWriter("ember-doc", dir=tempfile.mkdtemp(), config={"lr": 0.1}, settings={"silent": True})
        >>> w.write_scalars(1, {"loss": 0.5}); w.write_scalars(1, {"acc": 0.75}); w.write_scalars(2, {"loss": 0.25})
        >>> w.run.summary["loss"], w.run.summary["acc"], w.run.config["lr"]  # step 1 committed, step 2 open
        (0.5, 0.75, 0.1)
        >>> w.close()
    """

    def __init__(
        self,
        project: str | None = None,
        *,
        mode: str = "offline",
        dir: str | os.PathLike[str] | None = None,  # wandb.init's own name for it
        config: Mapping[str, Any] | None = None,
        flush_secs: float = 5.0,
        **init_kwargs: Any,
    ) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ImportError(missing("WandbWriter", "wandb", "wandb")) from e
        if mode not in ("offline", "online", "disabled"):
            raise ValueError(f'`mode` must be "offline", "online" or "disabled", got {mode!r}.')
        if isinstance(flush_secs, bool) or not isinstance(flush_secs, int | float) or not 0 < flush_secs < math.inf:
            raise ValueError(f"`flush_secs` must be a positive number of seconds, got {flush_secs!r}.")
        settings = init_kwargs.pop("settings", None)
        if isinstance(settings, Mapping):
            settings = dict(settings)
        if (settings is None or isinstance(settings, dict)) and _FLUSH_ENV not in os.environ:
            settings = {_FLUSH_SETTING: float(flush_secs), **(settings or {})}
        self._wandb = wandb
        self._exit_code = 0
        self.run = wandb.init(
            settings=settings,
            project=project,
            mode=mode,
            dir=None if dir is None else os.fspath(dir),
            config=dict(config or {}),
            reinit="create_new",
            **init_kwargs,
        )

    def write_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """``run.log`` the values at ``step``."""
        self.run.log({k: float(v) for k, v in values.items()}, step=step)

    def write_histogram(self, step: int, name: str, values: Any) -> None:
        """A ``wandb.Histogram``: a [`Histogram`][ember.writers.Histogram]'s buckets (at most 512, W&B's limit)."""
        h = values if isinstance(values, Histogram) else histogram(np.asarray(values))
        counts, edges = h.on_host().numpy(max_buckets=512)
        self.run.log({name: self._wandb.Histogram(np_histogram=(counts.tolist(), edges.tolist()))}, step=step)

    def write_image(self, step: int, name: str, image: Any) -> None:
        """A ``wandb.Image`` (``(H, W, C)``)."""
        self.run.log({name: self._wandb.Image(np.asarray(image))}, step=step)

    def write_text(self, step: int, name: str, text: str) -> None:
        """The text, logged under its name."""
        self.run.log({name: text}, step=step)

    def write_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, float] | None = None) -> None:
        """Hyperparameters into the config; metrics into the summary."""
        self.run.config.update(dict(hparams), allow_val_change=True)
        for k, v in (metrics or {}).items():
            self.run.summary[k] = float(v)

    def set_outcome(self, outcome: str) -> None:
        """The exit code the run finishes with: 0 finished, 1 failed, 130 killed (W&B marks it preempted)."""
        self._exit_code = _EXIT_CODES[check_outcome(outcome)]
        if outcome == "killed":
            self.run.mark_preempting()

    def close(self) -> None:
        """Finish the run with its exit code (offline: its files are complete for ``wandb sync``)."""
        self.run.finish(exit_code=self._exit_code)
