"""Model adapters: one calling convention for Flax linen, Flax NNX and plain functions.

Every adapter is an ``apply_fn(params, model_state, key, train, *args, **kwargs) -> (outputs,
new_model_state)``. ``model_state`` holds the non-trainable collections (batch statistics); ``key`` is
the step's RNG key, or ``None`` for a deterministic call.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from flax import linen as nn

if TYPE_CHECKING:
    from flax import nnx

ApplyFn = Callable[..., tuple[Any, Any]]


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def linen_apply_fn(module: nn.Module, rng_names: Sequence[str], train_arg: str | None) -> ApplyFn:
    """The adapter for a linen module: params and the other collections as separate trees."""
    train_kw = train_arg if train_arg is not None and _accepts(module.__call__, train_arg) else None

    def apply(params: Any, model_state: Any, key: jax.Array | None, train: bool, *args: Any, **kwargs: Any):
        rngs = {name: jax.random.fold_in(key, i) for i, name in enumerate(rng_names)} if key is not None else None
        if train_kw is not None:
            kwargs = {train_kw: train, **kwargs}
        variables = {"params": params, **model_state}
        if train and model_state:
            out, updated = module.apply(variables, *args, rngs=rngs, mutable=list(model_state), **kwargs)
            return out, dict(updated)
        return module.apply(variables, *args, rngs=rngs, **kwargs), model_state

    return apply


def linen_init(
    module: nn.Module, sample_input: Any, key: jax.Array, rng_names: Sequence[str], train_arg: str | None
) -> tuple[Any, dict[str, Any]]:
    """Initialise a linen module; return ``(params, model_state)``."""
    keys = jax.random.split(key, len(rng_names) + 1)
    rngs = {"params": keys[0], **{name: keys[i + 1] for i, name in enumerate(rng_names)}}
    kwargs: dict[str, Any] = (
        {train_arg: False} if train_arg is not None and _accepts(module.__call__, train_arg) else {}
    )
    args = sample_input if isinstance(sample_input, tuple) else (sample_input,)
    # One compiled program, not one per operation: eager, a ResNet-18's init compiles ~110 small programs (11 s
    # on a CPU, 7 s as one). The sample's arrays are its arguments; anything else in it stays a Python value. The
    # program is kept for an equal module and sample layout: building the same model again costs no new trace.
    leaves, treedef = jax.tree.flatten(args)
    traced = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, (jax.Array, np.ndarray)))
    values = tuple((i, leaf) for i, leaf in enumerate(leaves) if i not in traced)
    layout = (module, treedef, traced, values, tuple(sorted(kwargs.items())))
    arrays = [leaves[i] for i in traced]
    try:
        hash(layout)
    except TypeError:  # a module or a sample value that cannot be a cache key: compiled for this call alone
        variables = dict(jax.jit(functools.partial(_init, layout))(rngs, arrays))
    else:
        variables = dict(_init_kept(layout, rngs, arrays))
    if "params" not in variables:
        raise ValueError(f"{type(module).__name__}.init produced no 'params' collection; it has {sorted(variables)}.")
    params = variables.pop("params")
    return params, variables


def _init(layout: Any, rngs: dict[str, jax.Array], arrays: list[Any]) -> Any:
    """``module.init`` on the sample ``layout`` describes, its arrays given apart (traced)."""
    module, treedef, traced, values, kwargs = layout
    leaves = dict(values) | dict(zip(traced, arrays, strict=True))
    return module.init(rngs, *treedef.unflatten([leaves[i] for i in range(len(leaves))]), **dict(kwargs))


_init_kept = jax.jit(_init, static_argnums=0)


def nnx_split(model: nnx.Module) -> tuple[Any, Any, Any]:
    """``(graphdef, params, model_state)`` of an NNX module; model_state holds everything but params."""
    from flax import nnx  # imported where used: flax.nnx takes half a second to import (IPython)

    graphdef, params, model_state = nnx.split(model, nnx.Param, ...)
    return graphdef, params, model_state


def nnx_apply_fn(graphdef: Any) -> ApplyFn:
    """The adapter for an NNX module split into ``graphdef``: merge, set the mode, reseed, call, split."""
    from flax import nnx

    def apply(params: Any, model_state: Any, key: jax.Array | None, train: bool, *args: Any, **kwargs: Any):
        # Rebuild the variables in the current trace (the step may be inside grad inside jit): NNX refuses to
        # mutate a variable created at another trace level, and reseeding mutates the RNG keys.
        params, model_state = jax.tree.map(lambda x: x, (params, model_state))
        model = nnx.merge(graphdef, params, model_state)
        if train:
            model.train()
        else:
            model.eval()
        if key is not None:
            streams = sorted({v.tag for _, v in nnx.iter_graph(model) if isinstance(v, nnx.RngKey)})
            if streams:
                keys: dict[str, Any] = {s: jax.random.fold_in(key, i) for i, s in enumerate(streams)}
                nnx.reseed(model, **keys)
            if "rngs" not in kwargs and _accepts(type(model).__call__, "rngs"):
                # Flax's own examples pass ``rngs`` at call time (``model(x, rngs=rngs)``, Dropout built
                # without any): give the call a stream of the step's key, as the model's own streams get
                kwargs = {**kwargs, "rngs": nnx.Rngs(jax.random.fold_in(key, len(streams)))}
        out = model(*args, **kwargs)
        _, _, new_state = nnx.split(model, nnx.Param, ...)
        # RNG streams are reseeded from the step key on every call, so their stored values never need to
        # change; keeping them makes the state identical on every device under pmap.
        new_state = jax.tree.map(
            lambda old, new: old if isinstance(new, nnx.RngState) else new,
            model_state,
            new_state,
            is_leaf=lambda x: isinstance(x, nnx.Variable),
        )
        return out, new_state

    return apply


def plain_apply_fn(fn: Callable[..., Any]) -> ApplyFn:
    """The adapter for ``fn(params, *args, **kwargs)``: no model state, no RNG."""

    def apply(params: Any, model_state: Any, key: jax.Array | None, train: bool, *args: Any, **kwargs: Any):
        return fn(params, *args, **kwargs), model_state

    return apply
