"""Ignite-style shortcuts for ``(x, y)`` batches: `create_supervised_trainer` and `..._evaluator`."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import optax
from flax import linen as nn

if TYPE_CHECKING:
    from flax import nnx

from ember.engine import Engine
from ember.training._step.steps import BoundModel
from ember.training._train_state import TrainState, as_train_state, is_flax_train_state
from ember.training._trainer import create_evaluator, create_trainer
from ember.training._training_engine import TrainingEngine


def _unpack(batch: Any) -> tuple[Any, Any]:
    # the ignore below: the batch is Any: any sequence of two is taken
    if not isinstance(batch, tuple | list) or len(batch) != 2:  # type: ignore[arg-type]
        raise TypeError(
            f"Supervised engines take (x, y) batches; got a {type(batch).__name__}. Use create_trainer with your "
            "own loss function for other batch structures."
        )
    return batch[0], batch[1]


def create_supervised_trainer(
    model: nn.Module | nnx.Module | TrainState,
    optimizer: optax.GradientTransformation,
    loss_fn: Callable[[Any, Any], Any],
    *,
    seed: int = 0,
    rngs: Sequence[str] = (),
    **trainer_kwargs: Any,
) -> TrainingEngine:
    """A trainer for ``(x, y)`` batches minimising ``loss_fn(y_pred, y)``, as Ignite's shortcut.

    A linen module is initialised from the first batch's ``x``; an NNX module is used as it is; a
    [`TrainState`][ember.training.TrainState] is taken as the starting point (``optimizer`` is then ignored). The step's
    output is ``{"loss": ..., "y_pred": ..., "y": ...}``, on device.

    Args:
        model: a ``flax.linen.Module``, a ``flax.nnx.Module``, or a [`TrainState`][ember.training.TrainState] (ember's,
            or a ``flax.training.train_state.TrainState``, converted by
            [`TrainState.from_flax`][ember.training.TrainState.from_flax]).
        optimizer: an optax optimizer.
        loss_fn: ``loss_fn(y_pred, y) -> scalar``, e.g. ``optax.softmax_cross_entropy_with_integer_labels``
            followed by a mean.
        seed: the initialisation and per-step RNG seed.
        rngs: RNG streams a linen model needs, such as ``("dropout",)``.
        **trainer_kwargs: passed to [`create_trainer`][ember.training.create_trainer] (``placement``,
            ``steps_per_call``, ...).

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from flax import linen as nn
        >>> from ember.training import create_supervised_trainer
        >>> trainer = create_supervised_trainer(nn.Dense(1), optax.sgd(0.1), lambda p, y: jnp.mean((p - y) ** 2))
        >>> data = [(jnp.ones((4, 2)), jnp.full((4, 1), 2.0))] * 5
        >>> round(float(trainer.run(data, max_epochs=10).output["loss"]), 3)
        0.0
    """
    if not callable(loss_fn):
        raise TypeError(f"`loss_fn` must be callable as loss_fn(y_pred, y), got {loss_fn!r}.")

    def loss(bound: BoundModel, batch: Any) -> Any:
        x, y = _unpack(batch)
        y_pred = bound(x)
        return loss_fn(y_pred, y), {"y_pred": y_pred, "y": y}

    state: TrainState | Callable[[Any], TrainState]
    if isinstance(model, TrainState) or is_flax_train_state(model):
        state = as_train_state(model, "model")
    elif _is_nnx_module(model):
        state = TrainState.from_nnx(model, optimizer, seed=seed)
    elif isinstance(model, nn.Module):
        module = model

        def build(batch: Any) -> TrainState:
            return TrainState.from_linen(module, _unpack(batch)[0], optimizer, seed=seed, rngs=rngs)

        state = build
    else:
        raise TypeError(
            "`model` must be a flax.linen.Module, a flax.nnx.Module, an ember.training.TrainState or a "
            f"flax.training.train_state.TrainState, got {type(model).__module__}.{type(model).__qualname__}."
        )
    return create_trainer(state, loss, **trainer_kwargs)


def create_supervised_evaluator(
    source: TrainState | Engine,
    metrics: Mapping[str, Any] | None = None,
    **evaluator_kwargs: Any,
) -> TrainingEngine:
    """An evaluator for ``(x, y)`` batches whose output is ``{"y_pred": ..., "y": ...}``, as Ignite's shortcut.

    Args:
        source: the trainer (its current train state is used at each run) or a
            [`TrainState`][ember.training.TrainState].
        metrics: metrics to attach by name; each needs an ``attach(engine, name)`` method.
        **evaluator_kwargs: passed to [`create_evaluator`][ember.training.create_evaluator].

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import TrainState, create_supervised_evaluator
        >>> state = TrainState.create(lambda p, x: x * p, jnp.array(2.0), optax.sgd(0.1))
        >>> evaluator = create_supervised_evaluator(state)
        >>> out = evaluator.run([(jnp.ones(3), jnp.zeros(3))]).output
        >>> out["y_pred"].tolist(), out["y"].tolist()
        ([2.0, 2.0, 2.0], [0.0, 0.0, 0.0])
    """

    def evaluate(bound: BoundModel, batch: Any) -> dict[str, Any]:
        x, y = _unpack(batch)
        return {"y_pred": bound(x), "y": y}

    evaluator = create_evaluator(source, evaluate, **evaluator_kwargs)
    for name, metric in (metrics or {}).items():
        if not callable(getattr(metric, "attach", None)):
            raise TypeError(f"Metric {name!r} has no attach(engine, name) method; got {type(metric).__name__}.")
        metric.attach(evaluator, name)
    return evaluator


def _is_nnx_module(model: Any) -> bool:
    """Whether ``model`` is a ``flax.nnx.Module`` (never, if no one has imported flax.nnx: it is not imported here)."""
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(model, nnx.Module)
