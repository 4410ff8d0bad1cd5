"""Step builders: pure ``(state, batch) -> (state, output)`` functions from a user loss function."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax.numpy as jnp
import optax

from ember.training._step.extras import check_extras, compute_extras
from ember.training._step.gradients import accumulated, averaged_over, check_accumulate, differentiate, step_key
from ember.training._step.model import BoundModel, forward_of
from ember.training._step.precision import Policy, cast_floating, policy
from ember.training._step.remat import check_remat
from ember.training._train_state import TrainState

Output = dict[str, Any]
TrainStep = Callable[[TrainState, Any], tuple[TrainState, Output]]
EvalStep = Callable[[TrainState, Any], Any]


def make_train_step(
    loss_fn: Callable[[BoundModel, Any], Any],
    *,
    accumulate_steps: int = 1,
    extras: Sequence[str] = (),
    lr_schedule: Callable[[Any], Any] | None = None,
    axis_name: str | None = None,
    remat: str | None = None,
    precision: str = "32-true",
) -> TrainStep:
    """Build ``step(state, batch) -> (state, output)`` from ``loss_fn(model, batch)``.

    ``loss_fn`` returns the scalar loss, or ``(loss, aux)`` with a dict of extra outputs (predictions,
    per-example values). The step draws its RNG key from ``fold_in(state.rng, state.step)`` (and the
    device index under ``pmap``), differentiates, updates the model state, and applies one optimizer
    update. ``output`` is ``{"loss": loss, **aux, **extras}``, left on device.

    Args:
        loss_fn: ``loss_fn(model, batch)``, where ``model`` is a [`BoundModel`][ember.training.BoundModel].
        accumulate_steps: split the batch into this many micro-batches and average their gradients,
            for one optimizer update; per-example aux values are concatenated, scalar ones averaged.
        extras: in-step values for handlers, from ``"grad_norm"``, ``"update_norm"``, ``"param_norm"``,
            ``"lr"``; nothing is computed for those not asked for.
        lr_schedule: the schedule the optimizer uses, evaluated at the step for ``"lr"`` (otherwise the
            learning rate is read from an ``optax.inject_hyperparams`` state).
        axis_name: under ``pmap``, the device axis: gradients, loss, float aux values and model state
            are averaged over it (aux values only when they are float scalars; per-example values keep
            a leading device axis). Placements set it.
        remat: recompute the forward pass in the backward instead of keeping it, by JAX's checkpoint policy
            name: ``"full"`` (keep only the inputs), ``"dots_saveable"`` (keep the matrix products),
            ``"dots_with_no_batch_dims_saveable"``, ``"nothing_saveable"``, ``"everything_saveable"``; the
            numbers are the same, the memory of the step is not.
        precision: ``"32-true"`` (as given), ``"bf16-mixed"``, ``"bf16-true"`` or ``"16-mixed"``: the loss function
            sees the parameters and the floating inputs cast to bfloat16 (float16 for ``"16-mixed"``); the loss and
            every floating aux value are reported in float32, the model state keeps its dtype. Gradients come back
            in the parameters' dtype: float32 for the mixed policies, bfloat16 for ``"bf16-true"`` (whose state
            [`create_trainer`][ember.training.create_trainer] stores in bfloat16). ``"16-mixed"`` scales the loss by
            ``state.loss_scale`` (a [`DynamicLossScale`][ember.training.DynamicLossScale]) and adds ``"loss_scale"``
            (the step's scale) to the output. A model that sets its own ``dtype`` keeps it.

    A state with a [`StepGuard`][ember.training.StepGuard] in ``state.guard`` (``create_trainer(skip_nonfinite=True)``,
    and every ``"16-mixed"`` state) has an update whose loss or gradients are not finite, or spike, left unapplied
    inside the step (parameters, optimizer state, model state and ``state.step`` unchanged), and the output carries
    ``"skipped"``, ``"skip_reason"`` and ``"consecutive_skips"``.

    Returns:
        The pure step function, ready for ``jax.jit``.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import TrainState, make_train_step
        >>> state = TrainState.create(lambda p, x: x * p, jnp.array(1.0), optax.sgd(0.5))
        >>> step = make_train_step(lambda model, b: jnp.mean((model(b) - 3.0) ** 2), extras=("grad_norm",))
        >>> state, out = step(state, jnp.ones(8))
        >>> float(out["loss"]), float(out["grad_norm"]), float(state.params)
        (4.0, 4.0, 3.0)
    """
    if not callable(loss_fn):
        raise TypeError(f"`loss_fn` must be callable as loss_fn(model, batch), got {loss_fn!r}.")
    check_accumulate(accumulate_steps)
    names = check_extras(extras, lr_schedule)
    check_remat(remat)
    rule = policy(precision)

    def step(state: TrainState, batch: Any) -> tuple[TrainState, Output]:
        settling = _settling(state, rule)  # the wrappers with state of their own: the guard, the loss scale
        scale = state.loss_scale.scale if rule.scaled and state.loss_scale is not None else None
        gradients = differentiate(forward_of(loss_fn, state, rule.compute), remat=remat, scale=scale)
        gradients = averaged_over(accumulated(gradients, accumulate_steps), axis_name)
        key = step_key(state.rng, state.step, axis_name)
        (loss, aux, model_state), grads = gradients(state.params, state.model_state, batch, key)
        updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, model_state=model_state)
        reported: dict[str, Any] = {}
        for wrapper in settling:  # each keeps its own state and says what it reports
            new_state, said = wrapper.settle(state, new_state, loss, grads)
            reported.update(said)
        more = compute_extras(names, grads, updates, new_state.params, new_state.opt_state, state.step, lr_schedule)
        return new_state, {"loss": loss, **aux, **more, **reported}

    return step


class Settles(Protocol):
    """A wrapper with state of its own in the train state, settled after the optimizer's update (the guard, the scale).

    ``settle`` gives the state to go on from (holding the wrapper's new state) and what the step reports of it.
    """

    def settle(self, before: Any, proposed: Any, loss: Any, grads: Any) -> tuple[Any, dict[str, Any]]: ...


def _settling(state: TrainState, rule: Policy) -> list[Settles]:
    """The wrappers that settle the state after the optimizer's update, in order: the guard first, then the scale."""
    if rule.scaled and (state.loss_scale is None or state.guard is None):
        raise ValueError(
            'precision="16-mixed" needs a state with a loss scale and a step guard: create_trainer adds them; with '
            "make_train_step, pass state.replace(loss_scale=DynamicLossScale.create(), guard=StepGuard.create())."
        )
    guard: list[Settles] = [] if state.guard is None else [state.guard]  # a skipped update leaves the state as it was
    return [*guard, state.loss_scale] if rule.scaled and state.loss_scale is not None else guard


def make_eval_step(eval_fn: Callable[[BoundModel, Any], Any], *, precision: str = "32-true") -> EvalStep:
    """Build ``step(state, batch) -> output`` from ``eval_fn(model, batch)``, the model in eval mode.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import TrainState, make_eval_step
        >>> state = TrainState.create(lambda p, x: x * p, jnp.array(2.0), optax.sgd(0.1))
        >>> step = make_eval_step(lambda model, b: {"y_pred": model(b["x"]), "y": b["y"]})
        >>> step(state, {"x": jnp.array([1.0, 2.0]), "y": jnp.array([2.0, 5.0])})["y_pred"].tolist()
        [2.0, 4.0]
    """
    if not callable(eval_fn):
        raise TypeError(f"`eval_fn` must be callable as eval_fn(model, batch), got {eval_fn!r}.")

    dtype = policy(precision).compute

    def step(state: TrainState, batch: Any) -> Any:
        if dtype is None:
            return eval_fn(BoundModel(state, state.params, state.model_state, None, train=False), batch)
        model = BoundModel(state, cast_floating(state.params, dtype), state.model_state, None, train=False)
        return cast_floating(eval_fn(model, cast_floating(batch, dtype)), jnp.float32)

    return step
