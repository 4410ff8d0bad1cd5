"""Step builders: pure ``(state, batch) -> (state, output)`` functions from a user loss function."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax

from ember.training._step.extras import check_extras, compute_extras
from ember.training._step.precision import all_finite, cast_floating, keep_if, policy
from ember.training._step.remat import check_remat, rematted
from ember.training._train_state import TrainState

Output = dict[str, Any]
TrainStep = Callable[[TrainState, Any], tuple[TrainState, Output]]
EvalStep = Callable[[TrainState, Any], Any]


class BoundModel:
    """The model as a loss function sees it: bound to the params, the model state and the step's RNG.

    Calling it runs the model (``model(x)``); the updated model state (batch statistics) is kept and
    returned by the step. Each call draws its own RNG key, so two calls use different dropout masks.

    Attributes:
        params: the parameters being differentiated (for regularisers such as weight decay).
        model_state: the model state after the last call.
        train: whether the model runs in training mode.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import TrainState, make_train_step
        >>> state = TrainState.create(lambda p, x: x * p, jnp.array(2.0), optax.sgd(0.1))
        >>> def loss_fn(model, batch):
        ...     return jnp.mean((model(batch["x"]) - batch["y"]) ** 2) + 0.0 * model.params
        >>> step = make_train_step(loss_fn)
        >>> state, out = step(state, {"x": jnp.ones(4), "y": jnp.zeros(4)})
        >>> float(out["loss"])
        4.0
    """

    def __init__(self, state: TrainState, params: Any, model_state: Any, key: jax.Array | None, train: bool) -> None:
        self._apply = state.apply_fn
        self.params = params
        self.model_state = model_state
        self._key = key
        self._calls = 0
        self.train = train

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = None if self._key is None else jax.random.fold_in(self._key, self._calls)
        self._calls += 1
        out, self.model_state = self._apply(self.params, self.model_state, key, self.train, *args, **kwargs)
        return out


def _split_loss(out: Any) -> tuple[Any, dict[str, Any]]:
    """``(loss, aux)`` from what a loss function returned, refusing anything but a scalar or ``(scalar, dict)``."""
    # the ignore below: the loss function's return is Any until checked here
    if isinstance(out, tuple | list) and len(out) == 2:  # type: ignore[arg-type]
        loss, aux = out  # type: ignore[misc]  # the loss function's return is Any until checked here
        if not isinstance(aux, dict):
            raise TypeError(f"A loss function returning (loss, aux) must give aux as a dict, got {type(aux).__name__}.")
        if "loss" in aux:
            raise ValueError("The aux dict of a loss function may not use the key 'loss'; the step sets it.")
    else:
        loss, aux = out, {}
    shape = getattr(loss, "shape", None)
    if shape != () or not jnp.issubdtype(jnp.result_type(loss), jnp.floating):
        raise TypeError(
            "`loss_fn` must return a float scalar loss, or (loss, aux) with aux a dict; it returned "
            f"{_describe_returned(out)}." + (" Reduce a per-example loss with .mean()." if shape else "")
        )
    return loss, aux  # type: ignore[return-value]  # checked above: a scalar and a mapping


def _describe_returned(out: Any) -> str:
    if isinstance(out, tuple | list):
        # the ignore below: a tuple or list here (the branch above)
        inner = ", ".join(_describe_returned(x) for x in out)  # type: ignore[union-attr]
        # the ignore below: a tuple or list here (the branch above)
        return f"a {type(out).__name__} of {len(out)} ({inner})"  # type: ignore[arg-type]
    shape, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
    if shape is not None and dtype is not None:
        return f"an array of shape {tuple(shape)} and dtype {dtype}"
    return "a dict" if isinstance(out, dict) else f"a value of type {type(out).__name__}"


def _pmean_floats(tree: Any, axis_name: str) -> Any:
    return jax.tree.map(lambda x: lax.pmean(x, axis_name) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _is_float_scalar(x: Any) -> bool:
    """A per-device scalar that pmap averages (a loss, a mean); per-example values keep their device."""
    return x.ndim == 0 and jnp.issubdtype(x.dtype, jnp.floating)


def _merge_micro(aux: Any) -> Any:
    """Stacked per-micro-batch aux values: per-example ones concatenated, scalars averaged."""
    return jax.tree.map(lambda x: x.mean(0) if x.ndim == 1 else x.reshape((-1, *x.shape[2:])), aux)


def _micro_batches(batch: Any, m: int) -> Any:
    def split(x: Any) -> Any:
        x = jnp.asarray(x)
        if x.ndim == 0 or x.shape[0] % m:
            raise ValueError(
                f"`accumulate_steps`={m} must divide the batch's leading axis; got a leaf of shape {x.shape}."
            )
        return x.reshape((m, x.shape[0] // m, *x.shape[1:]))

    return jax.tree.map(split, batch)


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
    if not isinstance(accumulate_steps, int) or isinstance(accumulate_steps, bool) or accumulate_steps < 1:
        raise ValueError(f"`accumulate_steps` must be a positive int, got {accumulate_steps!r}.")
    names = check_extras(extras, lr_schedule)
    check_remat(remat)
    rule = policy(precision)
    dtype = rule.compute

    def grad_of(state: TrainState, params: Any, model_state: Any, batch: Any, key: jax.Array):
        def loss_of(p: Any, model_state: Any, batch: Any, key: jax.Array) -> tuple[jax.Array, Any]:
            model = BoundModel(state, cast_floating(p, dtype), model_state, key, train=True)
            loss, aux = _split_loss(loss_fn(model, cast_floating(batch, dtype)))
            if dtype is not None:
                model_state = jax.tree.map(lambda new, old: new.astype(old.dtype), model.model_state, model_state)
                loss, aux = loss.astype(jnp.float32), cast_floating(aux, jnp.float32)
            else:
                model_state = model.model_state
            scaled = loss * state.loss_scale.scale if rule.scaled else loss  # differentiated; the loss is reported
            return scaled, (loss, aux, model_state)

        forward = rematted(loss_of, remat)
        (_, out), grads = jax.value_and_grad(forward, has_aux=True)(params, model_state, batch, key)
        if rule.scaled:
            grads = jax.tree.map(lambda g: g / state.loss_scale.scale.astype(g.dtype), grads)
        return out, grads

    def step(state: TrainState, batch: Any) -> tuple[TrainState, Output]:
        if rule.scaled and (state.loss_scale is None or state.guard is None):
            raise ValueError(
                'precision="16-mixed" needs a state with a loss scale and a step guard: create_trainer adds them; with '
                "make_train_step, pass state.replace(loss_scale=DynamicLossScale.create(), guard=StepGuard.create())."
            )
        key = jax.random.fold_in(state.rng, state.step)
        if axis_name is not None:
            key = jax.random.fold_in(key, lax.axis_index(axis_name))
        if accumulate_steps == 1:
            (loss, aux, model_state), grads = grad_of(state, state.params, state.model_state, batch, key)
        else:

            def micro(carry: Any, xs: Any) -> Any:
                grads_sum, model_state = carry
                mb, i = xs
                (loss, aux, model_state), g = grad_of(state, state.params, model_state, mb, jax.random.fold_in(key, i))
                return (jax.tree.map(jnp.add, grads_sum, g), model_state), (loss, aux)

            zeros = jax.tree.map(jnp.zeros_like, state.params)
            xs = (_micro_batches(batch, accumulate_steps), jnp.arange(accumulate_steps))
            (grads, model_state), (losses, aux) = lax.scan(micro, (zeros, state.model_state), xs)
            grads = jax.tree.map(lambda g: g / accumulate_steps, grads)
            loss, aux = losses.mean(), _merge_micro(aux)
        if axis_name is not None:
            grads, loss = lax.pmean((grads, loss), axis_name)
            model_state = _pmean_floats(model_state, axis_name)
            aux = jax.tree.map(lambda x: lax.pmean(x, axis_name) if _is_float_scalar(x) else x, aux)
        updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, model_state=model_state)
        reported: dict[str, Any] = {}
        if state.guard is not None:  # decided inside the step: a skipped update leaves the state as it was
            finite = all_finite(grads)
            norm = optax.tree.norm(grads)
            reason = state.guard.check(loss, finite, norm)
            kept = keep_if(reason == 0, new_state, state)
            new_state = kept.replace(guard=state.guard.update(reason, loss, norm))
            if rule.scaled:  # the scale halves on an overflow (not on a spike), grows after a run of finite steps
                new_state = new_state.replace(loss_scale=state.loss_scale.adjust(finite & jnp.isfinite(loss)))
            reported = new_state.guard.outputs()
        if rule.scaled:
            reported["loss_scale"] = state.loss_scale.scale
        more = compute_extras(
            names,
            grads=grads,
            updates=updates,
            params=new_state.params,
            opt_state=new_state.opt_state,
            step=state.step,
            lr_schedule=lr_schedule,
        )
        return new_state, {"loss": loss, **aux, **more, **reported}

    return step


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
