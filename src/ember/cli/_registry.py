"""What a config can name: models, optimizers and data sets."""

from __future__ import annotations

import gzip
import importlib
import importlib.util
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optax
from flax import linen as nn

from ember._extras import missing, require
from ember.cli._config import ConfigError, config_error, suggest
from ember.cli._schema import DataConfig, ModelConfig, OptimizerConfig, TrainerConfig
from ember.training import ema


class DigitsCNN(nn.Module):
    """A small CNN for 8x8 images: convolutions, average pooling, a hidden layer with dropout.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from ember.cli import DigitsCNN
        >>> variables = DigitsCNN().init(jax.random.key(0), jnp.ones((1, 8, 8, 1)))
        >>> DigitsCNN().apply(variables, jnp.ones((2, 8, 8, 1))).shape
        (2, 10)
    """

    features: Sequence[int] = (16, 32)
    hidden: int = 64
    num_classes: int = 10
    dropout: float = 0.1

    @nn.compact
    def __call__(self, x: Any, train: bool = False) -> Any:
        for f in self.features:
            x = nn.relu(nn.Conv(f, (3, 3))(x))
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        x = nn.relu(nn.Dense(self.hidden)(x.reshape((x.shape[0], -1))))
        x = nn.Dropout(self.dropout, deterministic=not train)(x)
        return nn.Dense(self.num_classes)(x)


class MLP(nn.Module):
    """Dense layers with ReLU on flattened inputs.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from ember.cli import MLP
        >>> variables = MLP(hidden=(8,)).init(jax.random.key(0), jnp.ones((1, 8, 8, 1)))
        >>> MLP(hidden=(8,)).apply(variables, jnp.ones((3, 8, 8, 1))).shape
        (3, 10)
    """

    hidden: Sequence[int] = (128,)
    num_classes: int = 10

    @nn.compact
    def __call__(self, x: Any, train: bool = False) -> Any:
        x = x.reshape((x.shape[0], -1))
        for h in self.hidden:
            x = nn.relu(nn.Dense(h)(x))
        return nn.Dense(self.num_classes)(x)


MODELS: dict[str, type[nn.Module]] = {"cnn": DigitsCNN, "mlp": MLP}


#: What `build_model` gives: a linen module, or a function of no arguments that builds an NNX module.
Model = nn.Module | Callable[[], Any]


def build_model(config: ModelConfig, seed: int = 0) -> Model:
    """The model a config names, built with its ``args``: a linen module, or a function building an NNX one.

    An NNX module's class is called with ``args`` and ``rngs=nnx.Rngs(seed)`` (ember supplies its RNG streams, from
    ``trainer.seed``); it is built once here, abstractly (nothing allocated), so that arguments it does not take are
    refused now, by name. Anything else ``model.name`` imports (a function, an instance, another class) is refused
    with what is accepted.

    Examples:
        >>> from ember.cli import load_config
        >>> from ember.cli._registry import build_model
        >>> build_model(load_config({"model": {"name": "mlp", "args": {"hidden": [8]}}}).model).hidden
        [8]
    """
    if ":" in config.name:
        module_name, _, attr = config.name.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"model.name: cannot import {config.name!r} ({e}).") from None
    elif config.name in MODELS:
        cls = MODELS[config.name]
    else:
        raise ConfigError(
            f"model.name: expected one of {sorted(MODELS)} or an import path 'package.module:Class', "
            f"got {config.name!r}."
        )
    nnx_module = _is_nnx_class(cls)
    if not nnx_module and not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        what = f"the class {cls.__name__}" if isinstance(cls, type) else f"a {type(cls).__name__}"
        raise ConfigError(
            f"model.name: {config.name!r} is {what}; expected a flax.linen.Module or a flax.nnx.Module subclass."
        )
    accepted = _arguments_of(cls)
    takes_rngs = nnx_module and (accepted is None or "rngs" in accepted)
    if takes_rngs and "rngs" in config.args:
        raise ConfigError(
            "model.args.rngs: ember gives an NNX module its rngs (nnx.Rngs(trainer.seed)); leave it out of model.args."
        )
    accepted = None if accepted is None else [name for name in accepted if not (takes_rngs and name == "rngs")]
    unknown = [k for k in config.args if accepted is not None and k not in accepted]
    if unknown and accepted is not None:
        problems = []
        for key in unknown:
            close = suggest(str(key), accepted)
            hint = f"; did you mean {close!r}?" if close else ""
            problems.append(
                f"model.args.{key}: {cls.__name__} takes no argument {key!r}{hint} (it takes: {', '.join(accepted)})"
            )
        raise config_error(problems)
    try:
        if not nnx_module:
            return cls(**config.args)
        from flax import nnx

        build = _nnx_builder(cls, dict(config.args), seed, takes_rngs)
        nnx.eval_shape(build)  # its arguments checked now, nothing allocated
        return build
    except TypeError as e:
        raise ConfigError(f"model.args: {cls.__name__} does not take {config.args!r} ({e}).") from None


def _is_nnx_class(cls: Any) -> bool:
    """Whether ``cls`` is a subclass of ``flax.nnx.Module`` (NNX imported only for a class that is not linen's)."""
    if not isinstance(cls, type) or issubclass(cls, nn.Module):
        return False
    from flax import nnx

    return issubclass(cls, nnx.Module)


def _nnx_builder(cls: type, args: dict[str, Any], seed: int, takes_rngs: bool) -> Callable[[], Any]:
    """A function building ``cls(**args)`` with fresh ``rngs`` of ``seed`` at each call (the same module each time)."""

    def build() -> Any:
        from flax import nnx

        return cls(**args, rngs=nnx.Rngs(seed)) if takes_rngs else cls(**args)

    build.__name__ = build.__qualname__ = cls.__name__
    return build


def _arguments_of(cls: Any) -> list[str] | None:
    """The constructor arguments of a model class (a linen module is a dataclass); ``None`` if unknown."""
    import dataclasses
    import inspect

    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls) if f.init and f.name not in ("parent", "name")]
    try:  # its __init__'s (an NNX module's metaclass shows only *args, **kwargs), less ``self``
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in parameters):
        return None
    return [p.name for p in parameters]


def build_schedule(config: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """The learning-rate schedule over ``total_steps`` optimizer updates."""
    if config.schedule == "constant":
        return optax.constant_schedule(config.learning_rate)
    if config.schedule == "cosine":
        return optax.cosine_decay_schedule(config.learning_rate, max(total_steps, 1))
    return optax.warmup_cosine_decay_schedule(
        0.0, config.learning_rate, config.warmup_steps, max(total_steps, config.warmup_steps + 1)
    )


def build_optimizer(config: OptimizerConfig, schedule: optax.Schedule | None) -> optax.GradientTransformation:
    """The optax optimizer: gradient clipping (if set), then the named update rule; with ``ema``, an average kept.

    With ``schedule=None`` the rule's learning rate is an ``optax.inject_hyperparams`` hyperparameter, starting
    at ``config.learning_rate`` (what ``ember lr-find`` sets step by step).
    """
    rules: dict[str, tuple[Any, dict[str, Any]]] = {
        "adamw": (optax.adamw, {"weight_decay": config.weight_decay}),
        "adam": (optax.adam, {}),
        "sgd": (optax.sgd, {"momentum": config.momentum}),
        "lamb": (optax.lamb, {"weight_decay": config.weight_decay}),
    }
    make, kwargs = rules[config.name]
    if schedule is None:
        rule = optax.inject_hyperparams(make)(learning_rate=config.learning_rate, **kwargs)
    else:
        rule = make(schedule, **kwargs)
    tx = optax.chain(optax.clip_by_global_norm(config.clip_norm), rule) if config.clip_norm else rule
    return tx if config.ema is None else ema(tx, momentum=config.ema)


def load_data(config: DataConfig) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The digits as train and validation arrays: ``{"x": (N, 8, 8, 1) float32 in [0, 1], "y": (N,) int32}``."""
    _check_fraction(config)
    images, target = digits_arrays()
    order = np.random.default_rng(config.seed).permutation(len(target))
    x = (images[order] / 16.0).astype(np.float32)[..., None]
    y = target[order].astype(np.int32)
    n_val = round(len(y) * config.val_fraction)
    return {"x": x[n_val:], "y": y[n_val:]}, {"x": x[:n_val], "y": y[:n_val]}


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's handwritten digits: images ``(1797, 8, 8)`` in 0..16 and their labels, as ``load_digits``.

    Read straight from the file scikit-learn ships (``datasets/data/digits.csv.gz``: 64 pixels and the label a row),
    without importing scikit-learn, whose import (SciPy's included) costs more than a second of every ``ember
    train``'s start; where that file is not found, ``load_digits`` itself.
    """
    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    if spec is None or spec.origin is None:
        raise ImportError(missing("The digits data set", "scikit-learn", "cli"))
    shipped = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if shipped.is_file():
        with gzip.open(shipped, "rt") as f:
            rows = np.loadtxt(f, delimiter=",")
        return rows[:, :-1].reshape(-1, 8, 8), rows[:, -1].astype(int)
    from sklearn.datasets import load_digits

    digits: Any = load_digits()  # a Bunch: images (N, 8, 8) in 0..16, target (N,)
    return np.asarray(digits.images), np.asarray(digits.target)


def _check_fraction(config: DataConfig) -> None:
    if not 0 < config.val_fraction < 1:
        raise ConfigError(f"data.val_fraction: expected a number in (0, 1), got {config.val_fraction!r}.")


def build_data(config: DataConfig) -> tuple[Any, Any, Any]:
    """``(train, val, x)``: the training and validation data ``data.name`` names, and one input for shapes.

    Examples:
        >>> from ember.cli import load_config
        >>> from ember.cli._registry import build_data
        >>> train, val, x = build_data(load_config({}).data)
        >>> len(train), x.shape
        (22, (1, 8, 8, 1))
    """
    from ember.data import ArrayDataset, GrainPipeline, NpySource

    if config.name != "digits" and config.path is None:
        raise ConfigError(f"data.path: data {config.name!r} needs a path, and none was given.")
    if config.name == "digits":
        train_arrays, val_arrays = load_data(config)
        train = ArrayDataset(
            train_arrays, batch_size=config.batch_size, shuffle=True, seed=config.seed, drop_remainder=True
        )
        return train, ArrayDataset(val_arrays, batch_size=len(val_arrays["y"])), train_arrays["x"][:1]
    if config.name == "npy":
        require("grain", feature="data.name: npy", package="grain", extra="cli")
        _check_fraction(config)
        try:
            source = NpySource(config.path)  # type: ignore[arg-type]  # not None: checked above
        except ValueError as e:
            raise ConfigError(f"data.path: {e}") from None
        if set(source.paths) < {"x", "y"}:
            raise ConfigError(f"data.path: {config.path!r} must hold x.npy and y.npy; it holds {sorted(source.paths)}.")
        n_val = round(len(source) * config.val_fraction)
        val_part, train_part = _Part(source, 0, n_val), _Part(source, n_val, len(source))
        train = GrainPipeline(
            train_part, batch_size=config.batch_size, shuffle=True, seed=config.seed, worker_count=config.worker_count
        )
        import grain

        val = grain.MapDataset.source(val_part).batch(min(config.batch_size, n_val))  # every example, in order
        return train, val, source[0]["x"][None]
    module_name, _, function = config.path.partition(":")  # type: ignore[union-attr]  # not None: checked above
    try:
        make = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"data.path: expected 'package.module:function', got {config.path!r} ({e}).") from None
    made = make(batch_size=config.batch_size, seed=config.seed)
    if not (isinstance(made, tuple) and len(made) == 2):
        raise ConfigError(f"data.path: {config.path} must return (train, val), got {type(made).__name__}.")
    train, val = made
    return train, val, np.asarray(next(iter(train))["x"])[:1]


def model_output(model: Model, sample: Any, model_name: str) -> Any:
    """The shape of the model's output for ``sample`` (traced, nothing computed), or a `ConfigError` saying why not.

    A model that cannot take the data's inputs fails deep inside Flax or JAX (``operands could not be broadcast
    together with shapes (0,) (2,)`` for 2-D data into the built-in CNN); this names the model, the data's shape
    and, for the built-ins, what they take.

    Examples:
        >>> import numpy as np
        >>> from ember.cli import DigitsCNN
        >>> from ember.cli._registry import model_output
        >>> model_output(DigitsCNN(), np.zeros((1, 8, 8, 1), np.float32), "cnn").shape
        (1, 10)
        >>> model_output(DigitsCNN(), np.zeros((1, 2), np.float32), "cnn")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ember.errors.ConfigError: model 'cnn' cannot take the data's inputs: one batch of x is float32[1, 2] ...
    """
    import jax

    x = np.asarray(sample)
    try:
        if isinstance(model, nn.Module):
            return jax.eval_shape(
                lambda v: model.init_with_output(jax.random.key(0), v)[0], jax.ShapeDtypeStruct(x.shape, x.dtype)
            )
        return jax.eval_shape(lambda v: model()(v), jax.ShapeDtypeStruct(x.shape, x.dtype))  # an NNX module's
    except Exception as e:
        shape = ", ".join(str(n) for n in x.shape)
        takes = {
            "cnn": " The built-in cnn takes images, (batch, height, width, channels), such as the digits' "
            "(batch, 8, 8, 1); model.name=mlp takes inputs of any shape.",
        }.get(model_name, "")
        raise ConfigError(
            f"model {model_name!r} cannot take the data's inputs: one batch of x is {x.dtype}[{shape}] "
            f"({type(e).__name__}: {_first_line(e)}).{takes} Run with --debug for the "
            "traceback."
        ) from e


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def check_labels(config: DataConfig, train: Any, model: Model, sample: Any, model_name: str) -> None:
    """Refuse labels the model cannot output: each must be a class index below the model's output size.

    ``digits`` and ``npy`` check every label (``y.npy`` is read through a memory map); a ``grain`` function's
    data, the first training batch. A label past the last class trains to NaN, silently, without this.

    Examples:
        >>> from ember.cli import MLP, load_config
        >>> from ember.cli._registry import build_data, check_labels
        >>> cfg = load_config({})
        >>> train, _, x = build_data(cfg.data)
        >>> check_labels(cfg.data, train, MLP(num_classes=5), x, "mlp")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ember.errors.ConfigError: data: the labels go up to 9 (in the digits), but the model 'mlp' outputs 5 ...
    """
    if config.name == "digits":
        labels, where = np.asarray(train.arrays["y"]), "in the digits"
    elif config.name == "npy":
        labels, where = np.load(Path(config.path or ".") / "y.npy", mmap_mode="r"), "in y.npy"
    else:
        labels, where = np.asarray(next(iter(train))["y"]), "in the first training batch"
    if not np.issubdtype(labels.dtype, np.integer) or labels.size == 0:
        return
    low, high = int(labels.min()), int(labels.max())
    classes = int(model_output(model, sample, model_name).shape[-1])
    if low < 0:
        raise ConfigError(f"data: the labels must be class indices from 0, got {low} ({where}).")
    if high >= classes:
        raise ConfigError(
            f"data: the labels go up to {high} ({where}), but the model {model_name!r} outputs {classes} classes "
            f"(labels 0 to {classes - 1}); set model.args.num_classes={high + 1}, or check the labels."
        )


class _Part:
    """Records ``start`` to ``stop`` of a random-access source: the validation or training part of one folder."""

    def __init__(self, source: Any, start: int, stop: int) -> None:
        self.source, self.start, self.stop = source, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < len(self):
            raise IndexError(f"record {index} is out of range for {len(self)} records")
        return self.source[self.start + index]

    def __repr__(self) -> str:
        return f"{self.source!r}[{self.start}:{self.stop}]"


def build_placement(config: TrainerConfig) -> Any:
    """The placement ``trainer.placement`` names (``None`` for ``auto``), with its ``mesh`` and ``rules``.

    Examples:
        >>> from ember.cli import load_config
        >>> from ember.cli._registry import build_placement
        >>> build_placement(load_config({"trainer": {"placement": "fsdp"}}).trainer).batch_axes
        ('fsdp',)
    """
    import jax
    from jax.sharding import Mesh, PartitionSpec

    from ember.training import DataParallel, Pmap, Sharded, SingleDevice, fsdp

    rules = []
    for i, rule in enumerate(config.rules):
        if len(rule) < 2 or not isinstance(rule[0], str):
            raise ConfigError(f"trainer.rules[{i}]: expected [regex, axis or null, ...], got {rule!r}.")
        rules.append((rule[0], PartitionSpec(*rule[1:])))
    if config.mesh is not None and config.placement != "sharded":
        raise ConfigError(f"trainer.mesh: only placement 'sharded' takes a mesh; placement is {config.placement!r}.")
    if config.placement == "auto":
        return None
    if config.placement == "fsdp":
        return fsdp(rules=rules)
    if config.placement == "sharded":
        sizes = config.mesh or {}
        if not sizes or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in sizes.values()):
            raise ConfigError(f"trainer.mesh: expected axis names with positive int sizes, got {config.mesh!r}.")
        devices = jax.devices()
        if math.prod(sizes.values()) != len(devices):
            raise ConfigError(
                f"trainer.mesh: the sizes {dict(sizes)} multiply to {math.prod(sizes.values())}, but there are "
                f"{len(devices)} devices."
            )
        mesh = Mesh(np.array(devices).reshape(tuple(sizes.values())), tuple(sizes))
        return Sharded(mesh, rules=rules, fsdp_axis="fsdp" if "fsdp" in sizes else None)
    return {"single": SingleDevice, "data_parallel": DataParallel, "pmap": Pmap}[config.placement]()
