"""`ember lr-find`: the learning-rate range test on a config's model, optimizer and data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ember.cli._classifier import build_trainer
from ember.cli._config import Config, load_config
from ember.cli._registry import build_data


def find_learning_rate(
    config: Config | str | Path | dict[str, Any] | None = None,
    *,
    start_lr: float = 1e-7,
    end_lr: float = 10.0,
    num_iter: int = 100,
    output: str | Path | None = None,
) -> Any:
    """Run ``lr_find`` on the trainer ``ember train`` would build from ``config``; plot the curve to ``output``.

    The optimizer is the config's, with its learning rate injected so each step can set it (the schedule is
    left out: the range test is the schedule). Nothing is written but the PNG; the run folder is untouched.

    Returns:
        The [`LRFinderResult`][ember.training.LRFinderResult].

    Examples:
        >>> from ember.cli import find_learning_rate
        >>> result = find_learning_rate({"model": {"name": "mlp"}}, start_lr=1e-4, end_lr=1.0, num_iter=20)
        >>> 1e-4 <= result.suggestion <= 1.0
        True
    """
    from ember.training import lr_find

    cfg = config if isinstance(config, Config) else load_config(config)
    data, _, sample = build_data(cfg.data)
    trainer = build_trainer(cfg, sample, schedule=None, steps_per_call=1)
    result = lr_find(trainer, data, start_lr=start_lr, end_lr=end_lr, num_iter=num_iter)
    if output is not None:
        result.plot(output)
    return result
