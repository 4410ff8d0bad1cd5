"""The classifier `ember train` trains, from its config: its loss, its predictions, its trainer and its schedule.

`ember train`, `ember eval`, `ember plan` and `ember lr-find` build the same trainer here, so that an evaluation job
restores a run's checkpoints into the very train state the run saved.
"""

from __future__ import annotations

from typing import Any

import optax
from flax import linen as nn

from ember.cli._config import Config, ConfigError
from ember.cli._registry import build_model, build_optimizer, build_placement, build_schedule
from ember.training import TrainState, create_trainer


def loss(model: Any, batch: Any) -> Any:
    """The training loss of ``ember train``'s classifiers: softmax cross-entropy with integer labels."""
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()


def build_trainer(
    cfg: Config, sample: Any, schedule: Any = None, steps_per_call: int | None = None, *, lazy: bool = False
) -> Any:
    """The config's trainer (model, optimizer, placement) for inputs like ``sample``.

    With ``schedule=None`` the optimizer takes its learning rate as an injected hyperparameter (for the
    range test of ``ember lr-find``); else it follows ``schedule``. ``lazy``: the state is built from the first
    batch (``ember plan`` builds it abstractly, allocating nothing).
    """
    placement = build_placement(cfg.trainer)
    seed = cfg.trainer.seed
    model, tx = build_model(cfg.model, seed), build_optimizer(cfg.optimizer, schedule)

    def build(x: Any) -> TrainState:  # a sharded placement builds the state sharded
        if isinstance(model, nn.Module):
            return TrainState.from_linen(model, x, tx, seed=seed, rngs=("dropout",), placement=placement)
        return TrainState.from_nnx(model, tx, seed=seed, placement=placement)  # NNX: its shapes are its own

    state: Any = (lambda batch: build(batch["x"][:1])) if lazy else build(sample)
    k = cfg.trainer.steps_per_call if steps_per_call is None else steps_per_call
    return create_trainer(
        state,
        loss,
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


def learning_rates(cfg: Config, data: Any) -> tuple[int | None, Any]:
    """The training data's batches per epoch (``None``: the run counts iterations) and the run's schedule."""
    steps_per_epoch = cfg.data.epoch_length or _length(data)
    if steps_per_epoch is None and cfg.trainer.max_iters is None:
        raise ConfigError(
            "data.epoch_length: the training data has no len(), so give its batches per epoch (or trainer.max_iters)."
        )
    total = cfg.trainer.max_iters or cfg.trainer.max_epochs * (steps_per_epoch or 0)
    return steps_per_epoch, build_schedule(cfg.optimizer, total)


def predict(model: Any, batch: Any) -> Any:
    """The evaluation step of ``ember train``'s classifiers: predictions and labels, for the metrics."""
    return {"y_pred": model(batch["x"]), "y": batch["y"]}


def _length(data: Any) -> int | None:
    try:
        return len(data)
    except TypeError:
        return None
