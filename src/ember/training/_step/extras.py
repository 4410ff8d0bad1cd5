"""In-step extras a handler can ask for: global and per-layer norms, the gradients, the learning rate, on device."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from ember.training._step.opt_state import states_of

#: The extras ``make_train_step(extras=...)`` accepts: global norms, the learning rate, and for per-layer
#: logging each parameter's gradient norm and norm (``grad_norms``, ``param_norms``: ``{"Dense_0.kernel":
#: norm}``) or the gradient itself (``grads``, the params' tree).
EXTRAS = ("grad_norm", "update_norm", "param_norm", "lr", "grad_norms", "param_norms", "grads")


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


def _injects_lr(x: Any) -> bool:
    """Whether ``x`` is an ``optax.inject_hyperparams`` state holding a learning rate."""
    hyper = getattr(x, "hyperparams", None)
    return isinstance(hyper, dict) and "learning_rate" in hyper


def find_learning_rate(opt_state: Any) -> jax.Array | None:
    """The learning rate held by an ``optax.inject_hyperparams`` state anywhere in ``opt_state``."""
    found = [s for s in jax.tree.leaves(opt_state, is_leaf=_injects_lr) if _injects_lr(s)]
    return found[0].hyperparams["learning_rate"] if found else None


def with_learning_rate(opt_state: Any, lr: float) -> Any:
    """``opt_state`` with its ``optax.inject_hyperparams`` learning rate set to ``lr``, placed as before."""

    def set_rate(state: Any) -> Any:
        if not _injects_lr(state):
            return state
        old = state.hyperparams["learning_rate"]
        new = jax.device_put(jnp.asarray(lr, old.dtype), old.sharding)
        return state._replace(hyperparams={**state.hyperparams, "learning_rate": new})

    return jax.tree.map(set_rate, opt_state, is_leaf=_injects_lr)


def compute_extras(
    names: tuple[str, ...],
    grads: Any,
    updates: Any,
    params: Any,
    opt_state: Any,
    step: jax.Array,
    lr_schedule: Callable[[Any], Any] | None,
) -> dict[str, Any]:
    """The requested extras, traced into the step; nothing is computed for names not asked for."""
    out: dict[str, Any] = {}
    if "grad_norm" in names:
        out["grad_norm"] = optax.tree.norm(grads)
    if "update_norm" in names:
        out["update_norm"] = optax.tree.norm(updates)
    if "param_norm" in names:
        out["param_norm"] = optax.tree.norm(params)
    if "grad_norms" in names:
        out["grad_norms"] = layer_norms(grads)
    if "param_norms" in names:
        out["param_norms"] = layer_norms(params)
    if "grads" in names:
        out["grads"] = grads
    if "lr" in names:
        lr = lr_schedule(step) if lr_schedule is not None else find_learning_rate(opt_state)
        if lr is None:
            raise ValueError(
                "extras=('lr',) needs the learning rate: wrap the optimizer in optax.inject_hyperparams, "
                "or pass lr_schedule= (the schedule the optimizer uses)."
            )
        out["lr"] = lr * plateau_scale(opt_state)  # what the step applies, after a plateau's reductions
    return out


def plateau_scale(opt_state: Any) -> Any:
    """The scale a ``scale_by_plateau`` optimizer applies to its updates (1 without one)."""
    from ember.training._step.plateau import PlateauState

    found = states_of(opt_state, PlateauState)
    return found[0].plateau.scale if found else 1.0


def layer_norms(tree: Any) -> dict[str, jax.Array]:
    """``{"Dense_0.kernel": L2 norm}`` for each array of ``tree`` (parameters or gradients), on device.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.training._step.extras import layer_norms
        >>> {k: float(v) for k, v in layer_norms({"Dense_0": {"kernel": jnp.full((2, 2), 0.5)}}).items()}
        {'Dense_0.kernel': 1.0}
    """
    from ember.training._devices.partition import dotted

    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {dotted(path): optax.tree.norm(leaf) for path, leaf in flat}
