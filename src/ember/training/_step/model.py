"""The loss function as the step differentiates it: the model bound to its parameters, casts to the compute dtype."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from ember.training._step.precision import cast_floating

if TYPE_CHECKING:
    from ember.training._train_state import TrainState

#: ``forward(params, model_state, batch, key) -> (loss, aux, model_state)``: one evaluation of the loss function
Forward = Callable[[Any, Any, Any, jax.Array], tuple[jax.Array, dict[str, Any], Any]]


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


def forward_of(loss_fn: Callable[[BoundModel, Any], Any], state: TrainState, dtype: Any) -> Forward:
    """``loss_fn`` as a `Forward`: the model and the floating inputs in ``dtype`` (``None``: as stored).

    The precision cast is this wrapper's: the loss and every floating aux value come back in float32, and the model
    state in the dtype it is stored in.
    """

    def forward(params: Any, model_state: Any, batch: Any, key: jax.Array) -> tuple[jax.Array, dict[str, Any], Any]:
        model = BoundModel(state, cast_floating(params, dtype), model_state, key, train=True)
        loss, aux = _split_loss(loss_fn(model, cast_floating(batch, dtype)))
        if dtype is None:
            return loss, aux, model.model_state
        kept = jax.tree.map(lambda new, old: new.astype(old.dtype), model.model_state, model_state)
        return loss.astype(jnp.float32), cast_floating(aux, jnp.float32), kept

    return forward
