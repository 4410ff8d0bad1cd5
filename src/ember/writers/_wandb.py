"""`WandbWriter`: Weights & Biases, online or offline (an optional extra)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ember._extras import missing
from ember.writers._histogram import Histogram, histogram
from ember.writers._writer import Writer


class WandbWriter(Writer):
    """Logs to a Weights & Biases run; ``mode="offline"`` (the default here) writes locally, for ``wandb sync``.

    Scalars go to ``run.log(values, step=step)``; histograms and images become ``wandb.Histogram`` and ``wandb.Image``;
    text is logged as a string; hyperparameters go to the run's config and final metrics to its summary. Values written
    at the same step (training loss and validation metrics at iteration 100) merge into one row, which W&B commits when
    a later step arrives or at [`close`][ember.writers.WandbWriter.close]. W&B drops values for a step below the last
    one committed (with a warning of its own), so give every writer the trainer's iteration as its step. Install with
    ``pip install -e ".[wandb]"`` in a clone of ember.

    Args:
        project: the W&B project.
        mode: ``"offline"``, ``"online"`` or ``"disabled"``.
        dir: where W&B keeps its files (the run folder, say).
        config: hyperparameters to record at the start.
        init_kwargs: anything else ``wandb.init`` takes (``name``, ``tags``, ``entity``...).

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
        **init_kwargs: Any,
    ) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ImportError(missing("WandbWriter", "wandb", "wandb")) from e
        if mode not in ("offline", "online", "disabled"):
            raise ValueError(f'`mode` must be "offline", "online" or "disabled", got {mode!r}.')
        self._wandb = wandb
        self.run = wandb.init(
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

    def close(self) -> None:
        """Finish the run (offline: its files are complete for ``wandb sync``)."""
        self.run.finish()
