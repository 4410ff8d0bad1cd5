"""A train state as a flat ``{path: array}`` mapping for checkpoints, and back into the live structure.

Checkpoints store nested dicts of arrays. A train state may hold structures that are not dicts (Flax
NNX ``State`` objects, optax named tuples) and typed PRNG keys, which have no NumPy form. Flattening
with JAX's own key paths covers every pytree, and keys travel as their raw ``key_data``; restoring
rebuilds the live structure from the current state, so nothing about a model's classes is saved.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def _name(path: Any) -> str:
    return ".".join(jax.tree_util.keystr((k,), simple=True).replace("/", "%2F") for k in path)


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def flatten_tree(tree: Any) -> dict[str, Any]:
    """``{"params.Dense_0.kernel": array, ...}`` with PRNG keys as their ``key_data``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from ember._flat_tree import flatten_tree
        >>> flat = flatten_tree({"w": jnp.zeros(2), "rng": [jax.random.key(0)]})
        >>> {k: v.dtype.name for k, v in flat.items()}
        {'rng.0': 'uint32', 'w': 'float32'}
    """
    leaves, treedef = jax.tree.flatten(tree)
    names = _names.get(treedef)
    if names is None:  # a structure not seen before: name its paths once (a checkpoint each epoch reuses them)
        if len(_names) > 64:
            _names.clear()
        names = _names[treedef] = [_name(path) for path, _ in jax.tree_util.tree_leaves_with_path(tree)]
    return {name: jax.random.key_data(x) if _is_key(x) else x for name, x in zip(names, leaves, strict=True)}


_names: dict[Any, list[str]] = {}  # leaf names by tree structure


def unflatten_like(template: Any, flat: dict[str, Any]) -> Any:
    """``template``'s structure with leaves from ``flat`` (keys rewrapped with the template's key type).

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember._flat_tree import flatten_tree, unflatten_like
        >>> tree = {"w": jnp.zeros(2)}
        >>> unflatten_like(tree, {"w": jnp.ones(2)})["w"].tolist()
        [1.0, 1.0]
    """
    paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    missing = [_name(p) for p, _ in paths if _name(p) not in flat]
    if missing:
        raise KeyError(f"The checkpoint lacks train-state leaves {missing[:5]}{' ...' if len(missing) > 5 else ''}.")
    leaves = [
        jax.random.wrap_key_data(flat[_name(p)], impl=jax.random.key_impl(x)) if _is_key(x) else flat[_name(p)]
        for p, x in paths
    ]
    return jax.tree_util.tree_unflatten(treedef, leaves)
