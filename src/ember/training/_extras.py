"""In-step extras a handler can ask for: global norms and the learning rate, computed on device."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import optax

#: The extras ``make_train_step(extras=...)`` accepts.
EXTRAS = ("grad_norm", "update_norm", "param_norm", "lr")


def check_extras(extras: Sequence[str], lr_schedule: Callable[[Any], Any] | None) -> tuple[str, ...]:
    """Validate the requested extras; return them as a tuple."""
    if isinstance(extras, str):
        raise TypeError(f"`extras` must be a sequence of names such as ('grad_norm',), got the string {extras!r}.")
    unknown = [e for e in extras if e not in EXTRAS]
    if unknown:
        raise ValueError(f"Unknown `extras` {unknown}; choose from {list(EXTRAS)}.")
    if lr_schedule is not None and not callable(lr_schedule):
        raise TypeError(
            f"`lr_schedule` must be a callable of the step, such as an optax schedule; got {lr_schedule!r}."
        )
    return tuple(extras)


def find_learning_rate(opt_state: Any) -> jax.Array | None:
    """The learning rate held by an ``optax.inject_hyperparams`` state anywhere in ``opt_state``."""
    hyper = getattr(opt_state, "hyperparams", None)
    if isinstance(hyper, dict) and "learning_rate" in hyper:
        return hyper["learning_rate"]
    children = (
        opt_state.values() if isinstance(opt_state, dict) else opt_state if isinstance(opt_state, tuple | list) else ()
    )
    for child in children:
        found = find_learning_rate(child)
        if found is not None:
            return found
    return None


def compute_extras(
    names: tuple[str, ...],
    *,
    grads: Any,
    updates: Any,
    params: Any,
    opt_state: Any,
    step: jax.Array,
    lr_schedule: Callable[[Any], Any] | None,
) -> dict[str, jax.Array]:
    """The requested extras, traced into the step; nothing is computed for names not asked for."""
    out: dict[str, jax.Array] = {}
    if "grad_norm" in names:
        out["grad_norm"] = optax.tree.norm(grads)
    if "update_norm" in names:
        out["update_norm"] = optax.tree.norm(updates)
    if "param_norm" in names:
        out["param_norm"] = optax.tree.norm(params)
    if "lr" in names:
        lr = lr_schedule(step) if lr_schedule is not None else find_learning_rate(opt_state)
        if lr is None:
            raise ValueError(
                "extras=('lr',) needs the learning rate: wrap the optimizer in optax.inject_hyperparams, "
                "or pass lr_schedule= (the schedule the optimizer uses)."
            )
        out["lr"] = lr
    return out
