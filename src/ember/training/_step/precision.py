"""Precision policies by Lightning's names: what the loss function computes in, what is stored, what is reported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from ember.training._step.guard import StepGuard
from ember.training._step.loss_scale import DynamicLossScale

#: The policies ``create_trainer(precision=...)`` takes; Lightning's names, which users know.
PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-mixed")


@dataclass(frozen=True)
class Policy:
    """One precision policy: the dtype the loss function computes in, the dtype floats are stored in, and scaling.

    Attributes:
        name: the policy's name (``"bf16-mixed"``, ...).
        compute: the dtype the model and the loss see (parameters and floating inputs cast to it); ``None``: as
            stored.
        storage: the dtype the train state's floating arrays are stored in; ``None``: as the state was built.
        scaled: whether the loss is scaled dynamically (float16's narrow range needs it).
    """

    name: str
    compute: Any
    storage: Any
    scaled: bool


_POLICIES = {
    "32-true": Policy("32-true", None, None, False),
    "bf16-mixed": Policy("bf16-mixed", jnp.bfloat16, None, False),
    "bf16-true": Policy("bf16-true", jnp.bfloat16, jnp.bfloat16, False),
    "16-mixed": Policy("16-mixed", jnp.float16, None, True),
}


def policy(precision: object) -> Policy:
    """The policy named ``precision``; a `ValueError` naming the choices for anything else.

    Examples:
        >>> from ember.training._step.precision import policy
        >>> policy("bf16-mixed").compute, policy("bf16-mixed").storage
        (<class 'jax.numpy.bfloat16'>, None)
    """
    if not isinstance(precision, str) or precision not in _POLICIES:
        raise ValueError(f"`precision` must be one of {list(PRECISIONS)}, got {precision!r}.")
    return _POLICIES[precision]


def cast_floating(tree: Any, dtype: Any) -> Any:
    """Every floating array of ``tree`` as ``dtype`` (integers, keys and the rest untouched); ``None``: as given.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.training._step.precision import cast_floating
        >>> cast = cast_floating({"w": jnp.ones(2), "n": jnp.arange(2)}, jnp.bfloat16)
        >>> cast["w"].dtype, cast["n"].dtype
        (dtype(bfloat16), dtype('int32'))
    """
    if dtype is None:
        return tree

    def cast(x: Any) -> Any:
        if (
            hasattr(x, "dtype")
            and jnp.issubdtype(x.dtype, jnp.floating)
            and not jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
        ):
            return x.astype(dtype)
        return x

    return jax.tree.map(cast, tree)


def stored(state: Any, rule: Policy, guard: StepGuard | None = None) -> Any:
    """``state`` as ``rule`` keeps it: floats in its storage dtype, with a loss scale when it scales the loss.

    ``guard`` is put in a state that has none (a restored state keeps its own); a scaled policy adds the default one.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import TrainState
        >>> from ember.training._step.precision import policy, stored
        >>> state = TrainState.create(lambda p, x: p * x, jnp.ones(2), optax.adam(1e-3))
        >>> stored(state, policy("bf16-true")).opt_state[0].mu.dtype
        dtype(bfloat16)
    """
    if rule.storage is not None:
        state = state.replace(
            params=cast_floating(state.params, rule.storage),
            opt_state=cast_floating(state.opt_state, rule.storage),
            model_state=cast_floating(state.model_state, rule.storage),
        )
    if rule.scaled and state.loss_scale is None:
        state = state.replace(loss_scale=DynamicLossScale.create())
    if guard is not None and state.guard is None:
        state = state.replace(guard=guard)
    if rule.scaled and state.guard is None:  # an overflow's update is skipped
        state = state.replace(guard=StepGuard.create())
    return state
