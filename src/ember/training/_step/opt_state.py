"""Finding ember's own optimizer wrappers (an average of the weights, a plateau scale) in an optimizer state."""

from __future__ import annotations

from typing import Any, TypeVar

import jax

T = TypeVar("T")


def states_of(opt_state: Any, kind: type[T]) -> list[T]:
    """Every ``kind`` state (a NamedTuple an ember wrapper made) inside ``opt_state``, outermost first.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import ema
        >>> from ember.training._step.ema import EmaState
        >>> from ember.training._step.opt_state import states_of
        >>> tx = optax.chain(optax.clip(1.0), ema(optax.sgd(0.1)))
        >>> len(states_of(tx.init(jnp.zeros(2)), EmaState))
        1
    """
    leaves = jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, kind))
    return [leaf for leaf in leaves if isinstance(leaf, kind)]
