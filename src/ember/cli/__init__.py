"""The ``ember`` command: train from a YAML config, plan its memory, find a learning rate, resume, inspect, plot.

Importing it imports no JAX: the command checks its config and its run folder first (``ember --version``, a config
typo and a relaunch of a finished run answer at once); ``train`` and the rest load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ember.cli._config import Config, ConfigError, dump_config, load_config
from ember.cli._main import main
from ember.errors import RunHeldError

if TYPE_CHECKING:
    from ember.cli._checkpoint_contents import describe_checkpoint
    from ember.cli._goodput import goodput_table
    from ember.cli._lr_find import find_learning_rate
    from ember.cli._plan import plan_run
    from ember.cli._plot import plot_run
    from ember.cli._registry import MLP, DigitsCNN
    from ember.cli._train import train

#: Names loaded on first use, and the module each lives in (they import JAX and Flax).
_LAZY = {
    "describe_checkpoint": "ember.cli._checkpoint_contents",
    "goodput_table": "ember.cli._goodput",
    "find_learning_rate": "ember.cli._lr_find",
    "plan_run": "ember.cli._plan",
    "plot_run": "ember.cli._plot",
    "MLP": "ember.cli._registry",
    "DigitsCNN": "ember.cli._registry",
    "train": "ember.cli._train",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ember.cli' has no attribute {name!r}")


__all__ = [
    "MLP",
    "Config",
    "ConfigError",
    "DigitsCNN",
    "RunHeldError",
    "describe_checkpoint",
    "dump_config",
    "find_learning_rate",
    "goodput_table",
    "load_config",
    "main",
    "plan_run",
    "plot_run",
    "train",
]
