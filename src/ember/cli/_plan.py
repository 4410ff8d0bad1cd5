"""`ember plan`: the train and eval steps of a config compiled ahead of time, and the memory they need."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np

from ember.cli._classifier import build_trainer, predict
from ember.cli._config import Config, load_config
from ember.cli._registry import build_data
from ember.training import create_evaluator


def plan_run(
    config: Config | str | Path | dict[str, Any] | None = None,
    *,
    memory: int | None = None,
    max_batch: bool = False,
    multiple_of: int = 8,
) -> str:
    """What ``ember train`` would compile for ``config``, per device, and whether it fits; nothing is trained.

    The state is built abstractly and the train step (and the eval step) compiled for the config's placement and
    precision at ``data.batch_size``. With ``max_batch`` the largest global batch that fits is searched by compiling
    only. ``memory`` (bytes) is the budget per device; by default the device's own limit (none on CPU).

    Returns:
        The report ``ember plan`` prints.

    Examples:
        >>> from ember.cli import plan_run
        >>> report = plan_run({"model": {"name": "mlp"}}, memory=2**30)
        >>> print(report.splitlines()[-1])
        fits: needs ... of 1.00 GiB per device
    """
    cfg = config if isinstance(config, Config) else load_config(config)
    _, val, sample = build_data(cfg.data)
    x = np.asarray(sample)
    batch = {
        "x": jax.ShapeDtypeStruct((cfg.data.batch_size, *x.shape[1:]), x.dtype),
        "y": jax.ShapeDtypeStruct((cfg.data.batch_size,), np.int32),
    }
    trainer = build_trainer(cfg, sample, lazy=True)
    evaluator = create_evaluator(trainer, predict, placement=trainer.placement, precision=cfg.trainer.precision)
    val_batch = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype), next(iter(val)))
    train_plan = trainer.plan(batch, memory=memory)
    lines = [
        f"ember plan: {jax.default_backend()}, placement {type(trainer.placement).__name__}, "
        f"precision {cfg.trainer.precision}, {cfg.trainer.steps_per_call} step(s) per call",
        str(train_plan),
        str(evaluator.plan(val_batch, memory=memory)),
    ]
    if train_plan.limit is None:
        lines.append("This device reports no memory limit: --memory 8GiB (say) compares the plans with a budget.")
    if max_batch:
        found = trainer.max_batch(batch, memory=memory, multiple_of=multiple_of * trainer.placement.n_devices)
        lines.append(
            "no batch fits" if found is None else f"largest batch that fits: {found} (data.batch_size={found})"
        )
    return "\n".join(lines)
