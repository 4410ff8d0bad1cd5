"""From a forward to gradients, and the wrappers on the way: remat, loss scale, accumulation, the devices' mean.

Each wrapper takes a function and gives one of the same kind; ``make_train_step`` composes them. A
``Gradients`` is ``gradients(params, model_state, batch, key) -> ((loss, aux, model_state), grads)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ember.training._step.model import Forward
from ember.training._step.remat import rematted

Gradients = Callable[[Any, Any, Any, jax.Array], tuple[tuple[jax.Array, dict[str, Any], Any], Any]]


def differentiate(forward: Forward, *, remat: str | None, scale: jax.Array | None) -> Gradients:
    """The gradients of ``forward``'s loss, recomputed in the backward by the ``remat`` policy if one is named.

    With a loss ``scale`` (float16's), the loss is multiplied by it before differentiating and the gradients divided by
    it after; the loss reported is the unscaled one.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.training._step.gradients import differentiate
        >>> gradients = differentiate(lambda p, s, b, k: (jnp.sum(p * b), {}, s), remat=None, scale=jnp.float32(8))
        >>> (loss, _, _), grads = gradients(jnp.ones(2), {}, jnp.array([1.0, 3.0]), None)
        >>> float(loss), grads.tolist()
        (4.0, [1.0, 3.0])
    """

    def value(params: Any, model_state: Any, batch: Any, key: jax.Array) -> tuple[jax.Array, Any]:
        loss, aux, model_state = forward(params, model_state, batch, key)
        return (loss if scale is None else loss * scale), (loss, aux, model_state)  # the scaled one is differentiated

    def gradients(params: Any, model_state: Any, batch: Any, key: jax.Array) -> Any:
        (_, out), grads = jax.value_and_grad(rematted(value, remat), has_aux=True)(params, model_state, batch, key)
        if scale is None:
            return out, grads
        factor = scale  # the scale the loss was multiplied by
        return out, jax.tree.map(lambda g: g / factor.astype(g.dtype), grads)

    return gradients


def accumulated(gradients: Gradients, steps: int) -> Gradients:
    """``gradients`` over ``steps`` micro-batches of the batch, averaged: one update's worth, in less memory.

    The model state is carried from one micro-batch to the next; per-example aux values are concatenated, scalar ones
    (and the loss) averaged. ``steps=1`` gives ``gradients`` itself.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from ember.training._step.gradients import accumulated
        >>> whole = lambda p, s, b, k: ((jnp.mean(b), {}, s), jnp.mean(b) * p)
        >>> batch, key = jnp.array([1.0, 2.0, 3.0, 7.0]), jax.random.PRNGKey(0)
        >>> (loss, _, _), grads = accumulated(whole, 2)(jnp.ones(()), {}, batch, key)
        >>> float(loss), float(grads)
        (3.25, 3.25)
    """
    if steps == 1:
        return gradients

    def each(params: Any, model_state: Any, batch: Any, key: jax.Array) -> Any:
        def micro(carry: Any, xs: Any) -> Any:
            grads_sum, model_state = carry
            mb, i = xs
            (loss, aux, model_state), g = gradients(params, model_state, mb, jax.random.fold_in(key, i))
            return (jax.tree.map(jnp.add, grads_sum, g), model_state), (loss, aux)

        zeros = jax.tree.map(jnp.zeros_like, params)
        xs = (_micro_batches(batch, steps), jnp.arange(steps))
        (grads, model_state), (losses, aux) = lax.scan(micro, (zeros, model_state), xs)
        return (losses.mean(), _merge_micro(aux), model_state), jax.tree.map(lambda g: g / steps, grads)

    return each


def averaged_over(gradients: Gradients, axis_name: str | None) -> Gradients:
    """``gradients`` averaged over the ``pmap`` axis ``axis_name`` (``None``: ``gradients`` itself).

    The gradients, the loss, the model state's floats and the float scalars of aux are averaged; per-example aux
    values keep a leading device axis.
    """
    if axis_name is None:
        return gradients

    def mean(params: Any, model_state: Any, batch: Any, key: jax.Array) -> Any:
        (loss, aux, model_state), grads = gradients(params, model_state, batch, key)
        grads, loss = lax.pmean((grads, loss), axis_name)
        model_state = jax.tree.map(lambda x: lax.pmean(x, axis_name) if _floating(x) else x, model_state)
        aux = jax.tree.map(lambda x: lax.pmean(x, axis_name) if x.ndim == 0 and _floating(x) else x, aux)
        return (loss, aux, model_state), grads

    return mean


def step_key(rng: jax.Array, step: jax.Array, axis_name: str | None) -> jax.Array:
    """The step's RNG key: ``fold_in(rng, step)``, and under ``pmap`` the device's index folded in too."""
    key = jax.random.fold_in(rng, step)
    return key if axis_name is None else jax.random.fold_in(key, lax.axis_index(axis_name))


def check_accumulate(steps: object) -> None:
    """Raise unless ``steps`` (``accumulate_steps``) is a positive int."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"`accumulate_steps` must be a positive int, got {steps!r}.")


def _floating(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


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
