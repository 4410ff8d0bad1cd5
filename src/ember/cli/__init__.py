"""The ``ember`` command: train from a YAML config, find a learning rate, resume, inspect a checkpoint, plot a run."""

from ember.cli._config import Config, ConfigError, dump_config, load_config
from ember.cli._inspect import describe_checkpoint
from ember.cli._lr_find import find_learning_rate
from ember.cli._main import main
from ember.cli._plot import plot_run
from ember.cli._registry import MLP, DigitsCNN
from ember.cli._train import train

__all__ = [
    "MLP",
    "Config",
    "ConfigError",
    "DigitsCNN",
    "describe_checkpoint",
    "dump_config",
    "find_learning_rate",
    "load_config",
    "main",
    "plot_run",
    "train",
]
