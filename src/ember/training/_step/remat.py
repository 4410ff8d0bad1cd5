"""Remat by name: JAX's checkpoint policies, applied to the loss function, trading compute for memory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

#: The policies ``create_trainer(remat=...)`` takes: what the backward pass keeps from the forward (the rest
#: it computes again). ``"full"`` keeps only the inputs (JAX's default for ``jax.checkpoint``).
REMAT_POLICIES: dict[str, Callable[..., Any] | None] = {
    "full": None,
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "everything_saveable": jax.checkpoint_policies.everything_saveable,
}


def check_remat(remat: object) -> None:
    """Raise unless ``remat`` is ``None`` or a policy's name."""
    if remat is not None and remat not in REMAT_POLICIES:
        raise ValueError(f"`remat` must be None or one of {sorted(REMAT_POLICIES)}, got {remat!r}.")


def rematted(fn: Callable[..., Any], remat: str | None) -> Callable[..., Any]:
    """``fn`` under ``jax.checkpoint`` with the named policy (``None``: ``fn`` itself).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from ember.training._step.remat import rematted
        >>> f = rematted(lambda w: jnp.sum(jnp.tanh(w @ w)), "full")
        >>> g = jax.grad(f)(jnp.eye(2))
        >>> g.shape
        (2, 2)
    """
    check_remat(remat)
    if remat is None:
        return fn
    return jax.checkpoint(fn, policy=REMAT_POLICIES[remat])
