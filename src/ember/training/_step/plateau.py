"""Reduce the learning rate when an evaluation metric stops improving (optax.contrib.reduce_on_plateau)."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ember.engine import Engine, Events, RemovableEventHandle
from ember.training._step.opt_state import states_of


class PlateauState(NamedTuple):
    """The wrapped optimizer's state and ``optax.contrib``'s plateau state, whose ``scale`` the updates take."""

    inner: Any
    plateau: Any


def scale_by_plateau(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` whose updates are multiplied by the scale a [`ReduceLROnPlateau`][ember.training.ReduceLROnPlateau] sets.

    The scale (1 to start) lives in the optimizer state, so the step applies it inside the compiled call
    and checkpoints carry it; only the handler moves it, once per evaluation.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import scale_by_plateau
        >>> tx = scale_by_plateau(optax.sgd(0.1))
        >>> state = tx.init(jnp.zeros(2))
        >>> float(state.plateau.scale)
        1.0
    """

    def init(params: Any) -> PlateauState:
        return PlateauState(tx.init(params), optax.contrib.reduce_on_plateau().init(params))

    def update(updates: Any, state: PlateauState, params: Any = None) -> tuple[Any, PlateauState]:
        updates, inner = tx.update(updates, state.inner, params)
        scale = state.plateau.scale
        return jax.tree.map(lambda u: (scale * u).astype(u.dtype), updates), PlateauState(inner, state.plateau)

    # the ignore below: optax types update's third argument as a protocol our closure meets
    return optax.GradientTransformation(init, update)  # pyright: ignore[reportArgumentType]


def _plateau_of(opt_state: Any) -> PlateauState:
    found = states_of(opt_state, PlateauState)
    if len(found) != 1:
        raise ValueError(
            "ReduceLROnPlateau needs the trainer's optimizer wrapped once in ember.training.scale_by_plateau(tx); "
            f"its optimizer state holds {len(found)} such scales."
        )
    return found[0]


class ReduceLROnPlateau:
    """Multiplies the learning rate by ``factor`` after ``patience`` evaluations without improvement (Keras's rule).

    Attach it to an evaluator's COMPLETED: it reads ``evaluator.state.metrics[metric_name]`` and feeds it to
    ``optax.contrib.reduce_on_plateau``, whose state (the scale, the best value, the counters) sits in the
    trainer's optimizer state through [`scale_by_plateau`][ember.training.scale_by_plateau]. So the compiled
    step applies the scale, a checkpoint carries it, and a resumed run goes on exactly. An improvement is a
    value below ``best - threshold`` (``mode="min"``) or above ``best + threshold`` (``"max"``), Keras's
    ``min_delta``; the scale never goes below ``min_scale``. ``create_trainer(..., extras=("lr",))`` and
    [`LRMonitor`][ember.handlers.LRMonitor] report the learning rate with the scale applied.

    Args:
        trainer: the training engine whose optimizer is wrapped in ``scale_by_plateau``.
        metric_name: the evaluator's metric to watch.
        mode: ``"min"`` (a loss) or ``"max"`` (an accuracy).
        factor: the scale's multiplier at each reduction, in (0, 1).
        patience: evaluations without improvement before a reduction.
        threshold: the least change that counts as an improvement.
        cooldown: evaluations after a reduction before counting starts again (Keras's rule).
        min_scale: the smallest scale.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember import Engine
        >>> from ember.training import ReduceLROnPlateau, TrainState, create_trainer, scale_by_plateau
        >>> state = TrainState.create(lambda p, x: x * p, jnp.array(1.0), scale_by_plateau(optax.sgd(0.1)))
        >>> trainer = create_trainer(state, lambda model, x: model(x))
        >>> evaluator = Engine(lambda e, b: None)
        >>> plateau = ReduceLROnPlateau(trainer, "loss", factor=0.5, patience=1)
        >>> _ = plateau.attach(evaluator)
        >>> for loss in (1.0, 1.0, 0.5, 0.6):
        ...     evaluator.state.metrics["loss"] = loss
        ...     plateau(evaluator)
        >>> plateau.scale
        0.25
    """

    def __init__(
        self,
        trainer: Engine,
        metric_name: str,
        *,
        mode: Literal["min", "max"] = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        cooldown: int = 0,
        min_scale: float = 0.0,
    ) -> None:
        if not isinstance(trainer, Engine) or not hasattr(trainer.state, "train_state"):
            raise TypeError(f"`trainer` must be a training engine (create_trainer), got {type(trainer).__name__}.")
        if mode not in ("min", "max"):
            raise ValueError(f"`mode` must be 'min' or 'max', got {mode!r}.")
        if not 0 < factor < 1:
            raise ValueError(f"`factor` must be in (0, 1), got {factor!r}.")
        for name, value, least in (("patience", patience, 1), ("cooldown", cooldown, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"`{name}` must be an int >= {least}, got {value!r}.")
        if threshold < 0 or min_scale < 0:
            raise ValueError(f"`threshold` and `min_scale` must be >= 0, got {threshold!r} and {min_scale!r}.")
        if trainer.state.train_state is not None:  # refused now, not at the first evaluation (a lazy state: then)
            _plateau_of(trainer.state.train_state.opt_state)
        self.trainer, self.metric_name, self.sign = trainer, metric_name, 1.0 if mode == "min" else -1.0
        # Keras counts the evaluation at which its cooldown ends; optax's counts the one after: one less for optax.
        rule = optax.contrib.reduce_on_plateau(
            factor=factor,
            patience=patience,
            rtol=0.0,
            atol=threshold,
            cooldown=max(cooldown - 1, 0),
            min_scale=min_scale,
        )
        self._step = jax.jit(lambda plateau, value: rule.update(jnp.zeros(()), plateau, value=value)[1])

    @property
    def scale(self) -> float:
        """The current scale of the learning rate (a host read)."""
        return float(_plateau_of(self.trainer.state.train_state.opt_state).plateau.scale)

    def __call__(self, evaluator: Engine) -> None:
        """Feed the evaluator's metric to the rule; the trainer's optimizer state takes the new scale."""
        metrics = evaluator.state.metrics
        if self.metric_name not in metrics:
            raise KeyError(
                f"ReduceLROnPlateau watches {self.metric_name!r}; the evaluator's metrics are {sorted(metrics)}."
            )
        state = self.trainer.state.train_state
        old = _plateau_of(state.opt_state)
        new = self._step(old.plateau, jnp.asarray(self.sign * float(metrics[self.metric_name])))
        new = jax.tree.map(lambda n, o: jax.device_put(n, o.sharding), new, old.plateau)  # placed as before
        opt_state = jax.tree.map(
            lambda leaf: PlateauState(leaf.inner, new) if leaf is old else leaf,
            state.opt_state,
            is_leaf=lambda x: isinstance(x, PlateauState),
        )
        self.trainer.state.train_state = state.replace(opt_state=opt_state)

    def attach(self, evaluator: Engine) -> RemovableEventHandle:
        """Update the scale at each of the evaluator's COMPLETED; return the handle (see the class example)."""
        return evaluator.add_event_handler(Events.COMPLETED, self)
