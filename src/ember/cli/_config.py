"""The `ember train` configuration: typed sections, loaded from YAML with errors that say where and what."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from ember.errors import ConfigError


@dataclass
class ModelConfig:
    """The model: a registered name (``cnn``, ``mlp``) or an import path ``package.module:Class``."""

    name: str = "cnn"
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimizerConfig:
    """An optax optimizer with a schedule and the usual transforms."""

    name: Literal["adamw", "adam", "sgd", "lamb"] = "adamw"
    learning_rate: float = 3e-3
    schedule: Literal["constant", "cosine", "warmup_cosine"] = "cosine"
    warmup_steps: int = 0
    weight_decay: float = 1e-4
    clip_norm: float | None = 1.0
    momentum: float = 0.9


@dataclass
class DataConfig:
    """The data: ``digits``, or your own from a folder of ``.npy`` files (``npy``) or a function (``grain``).

    ``digits`` is scikit-learn's 1,797 handwritten 8x8 digits, shipped with it; ``npy`` reads ``x.npy`` and
    ``y.npy`` from disk as needed, so they may be larger than memory; ``grain`` calls your function for
    your own Grain pipeline.
    """

    name: Literal["digits", "npy", "grain"] = "digits"
    #: ``npy``: the folder holding ``x.npy`` and ``y.npy``; ``grain``: ``package.module:function``, called
    #: with ``batch_size`` and ``seed``, returning ``(train, val)`` iterables of ``{"x": ..., "y": ...}`` batches.
    path: str | None = None
    batch_size: int = 64
    #: ``digits`` and ``npy``: the part of the examples held out for validation.
    val_fraction: float = 0.2
    seed: int = 0
    #: ``npy``: Grain worker processes that read the records (0: this process reads them).
    worker_count: int = 0
    #: ``grain``: batches per epoch, for training data without a ``len()``.
    epoch_length: int | None = None


@dataclass
class TrainerConfig:
    """How long and where to train."""

    max_epochs: int = 15
    max_iters: int | None = None
    steps_per_call: int = 1
    placement: Literal["auto", "single", "data_parallel", "pmap", "fsdp", "sharded"] = "auto"
    #: Lightning's names (``create_trainer(precision=)``): float32; bfloat16 compute with float32 parameters;
    #: everything in bfloat16; float16 compute with float32 parameters and dynamic loss scaling.
    precision: Literal["32-true", "bf16-mixed", "bf16-true", "16-mixed"] = "32-true"
    #: recompute the forward pass in the backward by JAX's checkpoint policy name (``create_trainer(remat=)``).
    remat: Literal["full", "dots_saveable", "dots_with_no_batch_dims_saveable", "nothing_saveable"] | None = None
    #: skip an update whose loss or gradients are not finite, inside the step (``create_trainer(skip_nonfinite=)``).
    skip_nonfinite: bool = False
    #: with ``skip_nonfinite``: skip an update whose loss or gradient norm exceeds this times its running average.
    spike_factor: float | None = None
    #: with ``skip_nonfinite``: roll back to the latest checkpoint after this many skipped steps in a row (null: never).
    rollback_after: int | None = 3
    #: JAX's persistent compilation cache, so a relaunch does not compile again: ``auto`` (``.jax-cache`` beside the
    #: run folder), a folder, or null (off). A cache JAX was already given (JAX_COMPILATION_CACHE_DIR) is kept.
    compilation_cache: str | None = "auto"
    seed: int = 0
    eval_every: int = 1
    #: for ``placement: sharded``: mesh axis -> size, in order (``{fsdp: 2, model: 4}``); sizes multiply to the
    #: device count. An axis named ``fsdp`` gets the automatic FSDP rule.
    mesh: dict[str, int] | None = None
    #: for ``fsdp`` and ``sharded``: ``[regex, axis or null, ...]`` per rule, matched on parameter paths.
    rules: list[list[str | None]] = field(default_factory=list)


@dataclass
class CheckpointConfig:
    """Latest and best checkpoints (best by the validation metric of early stopping)."""

    keep_latest: int = 2
    keep_best: int = 1
    every_iters: int | None = None


@dataclass
class EarlyStoppingConfig:
    """Stop when the validation metric has not improved for ``patience`` evaluations."""

    patience: int = 5
    metric: Literal["accuracy", "loss"] = "accuracy"
    threshold: float = 0.0  # the least change that counts as an improvement (Ignite's name)


@dataclass
class StallConfig:
    """End a run that stops making progress with its stacks on disk and exit status 75 (``StallWatchdog``)."""

    step_timeout: float = 600.0  # seconds an iteration (or an evaluation's iteration) may take
    startup_timeout: float = 1800.0  # seconds until the first iteration completes (compilation included)
    save_timeout: float | None = None  # seconds a background checkpoint write may take


@dataclass
class HandlersConfig:
    """What runs beside training."""

    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    early_stopping: EarlyStoppingConfig | None = field(default_factory=EarlyStoppingConfig)
    progress: bool = True
    # WRITERS' names (ember.writers), written out so that checking a config imports no JAX; a test holds them equal
    writers: list[Literal["console", "tensorboard", "jsonl", "csv", "wandb", "mlflow"]] = field(
        default_factory=lambda: ["tensorboard", "jsonl"]
    )
    log_every: int = 50
    #: a StallWatchdog (``{}`` for its defaults); ``null``: none.
    stall: StallConfig | None = None


@dataclass
class Config:
    """Everything ``ember train`` needs; every field has a default (the embedded digits run).

    Examples:
        >>> from ember.cli import Config
        >>> Config().model.name, Config().trainer.max_epochs
        ('cnn', 15)
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    handlers: HandlersConfig = field(default_factory=HandlersConfig)
    output: str = "runs/digits"


_POSITIVE = frozenset(
    {"batch_size", "max_epochs", "max_iters", "steps_per_call", "eval_every", "keep_latest", "keep_best"}
    | {"every_iters", "patience", "log_every", "epoch_length", "rollback_after"}
)

#: Number fields with a range: field name -> (what is expected, the test).
_RANGES: dict[str, tuple[str, Any]] = {
    "learning_rate": ("a positive number", lambda v: v > 0),
    "weight_decay": ("a number >= 0", lambda v: v >= 0),
    "clip_norm": ("a positive number (or null for no clipping)", lambda v: v > 0),
    "momentum": ("a number in [0, 1)", lambda v: 0 <= v < 1),
    "val_fraction": ("a number in (0, 1)", lambda v: 0 < v < 1),
    "warmup_steps": ("an int >= 0", lambda v: v >= 0),
    "spike_factor": ("a number > 1 (or null)", lambda v: v > 1),
    "step_timeout": ("a positive number of seconds", lambda v: v > 0),
    "startup_timeout": ("a positive number of seconds", lambda v: v > 0),
    "save_timeout": ("a positive number of seconds (or null)", lambda v: v > 0),
}


def suggest(given: str, allowed: list[str]) -> str | None:
    """The allowed name a typo most likely meant: one it abbreviates, else the closest spelling."""
    starts = [a for a in allowed if a.startswith(given) and given]
    if len(starts) == 1:
        return starts[0]
    close = difflib.get_close_matches(given, allowed, n=1, cutoff=0.6)
    return close[0] if close else None


def _type_name(t: Any) -> str:
    if get_origin(t) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(t))
    if get_origin(t) in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(t))
    if get_origin(t) is list:
        return f"a list of {_type_name(get_args(t)[0])}"
    if get_origin(t) is dict:
        return "a mapping"
    if dataclasses.is_dataclass(t):
        return "a mapping"
    return {type(None): "null", bool: "true/false", int: "an int", float: "a number", str: "a string"}.get(t, str(t))


def _convert(value: Any, t: Any, path: str) -> Any:
    origin = get_origin(t)
    if origin in (Union, types.UnionType):
        options = get_args(t)
        if value is None and type(None) in options:
            return None
        real = [o for o in options if o is not type(None)]
        if len(real) == 1:  # Optional[X]: X's own, more precise, error
            return _convert(value, real[0], path)
        for option in real:
            try:
                return _convert(value, option, path)
            except ConfigError:
                pass
        raise ConfigError(f"{path}: expected {_type_name(t)}, got {value!r}.")
    if origin is Literal:
        if value not in get_args(t):
            close = suggest(str(value), [str(a) for a in get_args(t)])
            hint = f"; did you mean {close!r}?" if close else "."
            raise ConfigError(f"{path}: expected {_type_name(t)}, got {value!r}{hint}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected {_type_name(t)}, got {value!r}.")
        return [_convert(v, get_args(t)[0], f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}.")
        return dict(value)
    if dataclasses.is_dataclass(t):
        return _build(t, value, path)  # type: ignore[arg-type]  # is_dataclass narrowed t to a dataclass type
    if t in (int, float) and isinstance(value, str):
        value = _number(value, t)  # PyYAML reads 1e-3 (no dot) as a string
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
    }.get(t, False)
    if not ok:
        raise ConfigError(f"{path}: expected {_type_name(t)}, got {value!r} ({type(value).__name__}).")
    value = float(value) if t is float else value
    name = path.rsplit(".", 1)[-1]
    if name in _POSITIVE and value < 1:
        raise ConfigError(f"{path}: expected a positive int, got {value!r}.")
    if name in _RANGES and not isinstance(value, str | bool):
        expected, within = _RANGES[name]
        if not within(value):
            raise ConfigError(f"{path}: expected {expected}, got {value!r}.")
    return value


def _number(text: str, t: type) -> Any:
    """``text`` as a finite number of type ``t`` when it spells one (``"1e-3"``, ``"64"``), else unchanged."""
    try:
        number = float(text) if t is float else int(text.strip())
    except ValueError:
        return text
    return number if math.isfinite(number) else text


def _build(cls: type[Any], raw: Any, path: str) -> Any:
    """``cls`` from the mapping ``raw``; every problem in it (and in nested sections) raised at once."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {raw!r}.")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    problems: list[str] = []
    values = {}
    for key, value in raw.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in fields:
            close = suggest(str(key), sorted(fields))
            hint = f"; did you mean {close!r}?" if close else ""
            problems.append(f"{where}: unknown field{hint} (allowed: {', '.join(sorted(fields))})")
            continue
        try:
            values[key] = _convert(value, hints[key], where)
        except ConfigError as e:
            problems.extend(getattr(e, "problems", None) or [str(e)])
    if problems:
        raise config_error(problems)
    return cls(**values)


def config_error(problems: list[str]) -> ConfigError:
    """One error for all the problems found: the message itself for one, a list for several."""
    message = (
        problems[0]
        if len(problems) == 1
        else f"{len(problems)} problems in the config:\n" + "\n".join(f"  {problem}" for problem in problems)
    )
    error = ConfigError(message)
    error.problems = problems  # type: ignore[attr-defined]  # a ConfigError carries the list of problems for the caller
    return error


def _apply_overrides(raw: Any, overrides: Sequence[str]) -> dict[str, Any]:
    """``raw`` with each ``dotted.key=value`` set in it, the value read as YAML reads it (``3``, ``1e-3``, ``null``)."""
    import yaml

    raw = copy.deepcopy(raw) if isinstance(raw, dict) else {} if raw is None else raw
    if not isinstance(raw, dict):
        return raw  # _build names it
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r}: expected dotted.key=value, such as trainer.max_epochs=3.")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({e}).") from None
        *parents, last = key.split(".")
        section = raw
        for i, part in enumerate(parents):
            child = section.setdefault(part, {})
            if child is None:  # a section set to null (early_stopping: null): the override brings it back
                child = section[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(parents[: i + 1])} is {child!r}, not a section.")
            section = child
        section[last] = value
    return raw


def load_config(source: str | os.PathLike[str] | dict[str, Any] | None = None, overrides: Sequence[str] = ()) -> Config:
    """A [`Config`][ember.cli.Config] from a YAML file, a mapping, or nothing (the embedded default run).

    ``overrides`` are ``dotted.key=value`` strings, as ``ember train CONFIG trainer.max_epochs=3`` takes
    them; each value is read as YAML reads it, then checked with the rest. Unknown fields, wrong types and
    values outside a field's choices fail here, all at once, each with the field's dotted path, what was
    given, what is allowed and, for a typo, the closest allowed name.

    Examples:
        >>> from ember.cli import load_config
        >>> load_config({"optimizer": {"name": "sgd", "learning_rate": 0.1}}).optimizer.name
        'sgd'
        >>> load_config(None, ["trainer.max_epochs=3", "optimizer.learning_rate=1e-3"]).trainer.max_epochs
        3
    """
    if isinstance(overrides, str):
        raise TypeError(f"`overrides` must be a sequence of 'dotted.key=value' strings, got {overrides!r}.")
    raw: Any = {} if source is None else source
    if source is not None and not isinstance(source, dict):
        import yaml

        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"No config file at {path}.")
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({e}).") from None
        if raw is None:  # an empty file (or only comments): not the embedded run a user did not ask for
            raise ConfigError(
                f"{path} is empty. Write the fields to change (see `ember train --help` and the CLI page), or leave "
                "the file out to train the built-in example."
            )
    return _build(Config, _apply_overrides(raw, overrides), "")


def dump_config(config: Config, source: str | os.PathLike[str] | None = None) -> str:
    """``config`` as YAML text that [`load_config`][ember.cli.load_config] reads back to an equal config.

    ``source`` is the folder of the config file the run started from: a comment records it, so that a
    relaunch from the run folder (``ember resume RUN_DIR``) still finds a model module that sits beside
    the original config (`ember resume` reads it back).

    Examples:
        >>> from ember.cli import Config, dump_config, load_config
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "config.yaml"
        >>> _ = path.write_text(dump_config(Config()))
        >>> load_config(path) == Config()
        True
    """
    import yaml

    header = f"{_SOURCE}{Path(source).resolve()}\n" if source is not None else ""
    text: str = header + yaml.safe_dump(dataclasses.asdict(config), sort_keys=False)
    return text


_SOURCE = "# ember: model modules are also looked for in "


def config_source(config_file: str | os.PathLike[str]) -> Path:
    """The folder a run's model module may sit in: the one its config file recorded, or the file's own.

    Examples:
        >>> import tempfile, pathlib
        >>> from ember.cli import Config, dump_config
        >>> from ember.cli._config import config_source
        >>> run, origin = pathlib.Path(tempfile.mkdtemp()), pathlib.Path(tempfile.mkdtemp())
        >>> _ = (run / "config.yaml").write_text(dump_config(Config(), source=origin))
        >>> config_source(run / "config.yaml") == origin.resolve()
        True
    """
    path = Path(config_file).resolve()
    with open(path, encoding="utf-8") as text:
        first = text.readline()
    return Path(first[len(_SOURCE) :].strip()) if first.startswith(_SOURCE) else path.parent


def importable(folder: str | os.PathLike[str]) -> None:
    """Put ``folder`` first on ``sys.path`` (once): a model named ``mymodels:Net`` may sit beside the config.

    Examples:
        >>> import sys, tempfile
        >>> from ember.cli._config import importable
        >>> folder = tempfile.mkdtemp(); importable(folder); sys.path[0] == folder
        True
    """
    import sys

    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
