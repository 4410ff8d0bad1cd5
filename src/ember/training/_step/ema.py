"""An exponential moving average of the parameters, kept in the optimizer state and updated in the step."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ember.training._step.opt_state import states_of


class EmaState(NamedTuple):
    """The wrapped optimizer's state, the averaged parameters and the number of optimizer steps."""

    inner: Any
    ema: Any
    steps: jax.Array


def _momentum(updates: jax.Array, momentum: float, momentum_warmup: float | None, warmup_iters: int | None) -> Any:
    """Ignite's ``EMAWarmUp``: linear from ``momentum_warmup`` (update 1) to ``momentum`` (update ``warmup_iters``)."""
    if momentum_warmup is None or warmup_iters is None:
        return jnp.asarray(momentum, jnp.float32)
    ramp = momentum_warmup + (momentum - momentum_warmup) * (updates - 1) / max(1, warmup_iters - 1)
    bound = jnp.minimum if momentum >= momentum_warmup else jnp.maximum
    return bound(jnp.asarray(momentum, jnp.float32), ramp.astype(jnp.float32))


def ema(
    tx: optax.GradientTransformation,
    momentum: float = 0.0002,
    *,
    momentum_warmup: float | None = None,
    warmup_iters: int | None = None,
    every: int = 1,
) -> optax.GradientTransformation:
    """``tx`` that also keeps an exponential moving average of the parameters (Ignite's ``EMAHandler``).

    After every ``every``-th optimizer step the average moves towards the new parameters:
    ``ema = (1 - m) * ema + m * params``, Ignite's rule, with ``m`` the ``momentum`` (0.0002 by default:
    a decay of 0.9998). With ``momentum_warmup`` and ``warmup_iters``, ``m`` goes linearly from
    ``momentum_warmup`` at the first update to ``momentum`` at update ``warmup_iters`` (Ignite's warm-up).
    The average starts at the initial parameters. It lives in the optimizer state, so it is updated inside
    the compiled step (no extra dispatch), placed and sharded like the parameters, saved with every
    checkpoint and resumed exactly. Evaluate with it through ``create_evaluator(..., use_ema=True)``, and
    read it with [`ema_params`][ember.training.ema_params].

    Args:
        tx: the optimizer.
        momentum: the weight of the new parameters in each update, in (0, 1).
        momentum_warmup: the momentum of the first update, for a warm-up (with ``warmup_iters``).
        warmup_iters: the updates over which the momentum goes from ``momentum_warmup`` to ``momentum``.
        every: update the average after every this many optimizer steps.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import TrainState, create_trainer, ema, ema_params
        >>> state = TrainState.create(lambda p, x: x * p, jnp.array(0.0), ema(optax.sgd(1.0), momentum=0.5))
        >>> trainer = create_trainer(state, lambda model, x: -model(x))  # the parameter grows by x each step
        >>> state = trainer.run([jnp.array(1.0)] * 2).train_state
        >>> float(state.params), float(ema_params(state))  # averages: 0.5 * 0 + 0.5 * 1, then 0.5 * 0.5 + 0.5 * 2
        (2.0, 1.25)
    """
    if not isinstance(momentum, float | int) or isinstance(momentum, bool) or not 0 < momentum < 1:
        raise ValueError(f"`momentum` must be a number in (0, 1), got {momentum!r}.")
    if (momentum_warmup is None) != (warmup_iters is None):
        raise ValueError(
            f"`momentum_warmup` and `warmup_iters` go together, got {momentum_warmup!r} and {warmup_iters!r}."
        )
    if momentum_warmup is not None and not 0 < momentum_warmup < 1:
        raise ValueError(f"`momentum_warmup` must be a number in (0, 1), got {momentum_warmup!r}.")
    for name, value in (("warmup_iters", warmup_iters), ("every", every)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"`{name}` must be a positive int, got {value!r}.")

    def init(params: Any) -> EmaState:
        copies = jax.tree.map(lambda p: jnp.array(p, copy=True), params)  # never the donated params themselves
        return EmaState(tx.init(params), copies, jnp.zeros((), jnp.int32))

    def update(updates: Any, state: EmaState, params: Any = None) -> tuple[Any, EmaState]:
        if params is None:
            raise ValueError("ember.training.ema needs the parameters: call update(updates, state, params).")
        updates, inner = tx.update(updates, state.inner, params)
        steps = state.steps + 1
        due = steps % every == 0
        m = _momentum(steps // every, momentum, momentum_warmup, warmup_iters)
        new_params = optax.apply_updates(params, updates)

        def average(old: Any, new: Any) -> Any:
            moved = ((1 - m) * old + m * new).astype(old.dtype)
            return jnp.where(due, moved, old)

        return updates, EmaState(inner, jax.tree.map(average, state.ema, new_params), steps)

    # the ignore below: optax types update's third argument as a protocol our closure meets
    return optax.GradientTransformation(init, update)  # pyright: ignore[reportArgumentType]


def ema_params(state: Any) -> Any:
    """The averaged parameters of a train state whose optimizer is wrapped in [`ema`][ember.training.ema].

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import TrainState, ema, ema_params
        >>> state = TrainState.create(lambda p, x: x * p, jnp.array(3.0), ema(optax.sgd(0.1)))
        >>> float(ema_params(state))  # the initial parameters, before any step
        3.0
    """
    found = states_of(state.opt_state, EmaState)
    if len(found) != 1:
        raise ValueError(
            "use_ema / ema_params need the train state's optimizer wrapped once in ember.training.ema(tx, ...); "
            f"its optimizer state holds {len(found)} such averages."
        )
    return found[0].ema


def with_ema_params(state: Any) -> Any:
    """``state`` with its parameters replaced by their average (inside a compiled evaluation step)."""
    return state.replace(params=ema_params(state))
