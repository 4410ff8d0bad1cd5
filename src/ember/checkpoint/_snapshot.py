"""What a save writes: a tree flattened to ``{path: leaf}``, checked, and copied out of training's reach."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization, traverse_util


def flat_leaves(tree: Any) -> dict[str, Any]:
    """``tree`` as ``{"a/b/c": leaf}``, leaves as they are (device arrays stay on device); checks leaf types."""
    state = serialization.to_state_dict(tree)
    flat = traverse_util.flatten_dict(state, sep="/", keep_empty_nodes=True) if isinstance(state, dict) else {"": state}
    out: dict[str, Any] = {}
    for path, leaf in flat.items():
        if leaf is traverse_util.empty_node:  # an empty subtree, such as optax's EmptyState()
            out[path] = {}
        elif (
            isinstance(leaf, np.ndarray | np.generic | jax.Array | jax.ShapeDtypeStruct)
            or leaf is None
            or isinstance(leaf, bool | int | float | str)
        ):
            out[path] = leaf
        else:
            raise TypeError(f"Checkpoint leaf {path!r} is a {type(leaf).__name__}; leaves must be arrays or scalars.")
    return out


def on_host(leaves: dict[str, Any]) -> dict[str, Any]:
    """``leaves`` with device arrays fetched (all transfers started at once) and arrays as NumPy."""
    fetched = jax.device_get(leaves)
    return {k: np.asarray(v) if isinstance(v, np.ndarray | np.generic) else v for k, v in fetched.items()}


def check_gatherable(tree: Any) -> None:
    """Raise unless every array can be read whole on this process (addressable here, or replicated)."""
    for path, x in jax.tree_util.tree_leaves_with_path(tree):
        if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
            raise ValueError(
                f"Checkpoint leaf {jax.tree_util.keystr(path)} is sharded across processes; this process cannot "
                "read it whole. Save sharded state with ember.checkpoint.OrbaxStore, where each process writes "
                "its own shards."
            )


def detach(tree: Any, pool: list[np.ndarray], *, on_device: bool = False) -> Any:
    """``tree`` in memory of its own, that training cannot change: what a background save writes.

    Arrays on an accelerator are copied to the host (``on_device=False``; every transfer is started at
    once), or copied on the device by one compiled call that returns at once (``on_device=True``); the
    writer thread then fetches the copies while training goes on. Arrays on the CPU backend and NumPy
    arrays are copied into ``pool``'s buffers: ``jax.device_get`` returns views of CPU device buffers, and a
    view would let the next training step, which donates the state, either overwrite what is being saved
    or (as XLA:CPU does) wait until the write lets go of the buffer. The buffers are reused from one save
    to the next (the previous write is finished by then): allocating a gigabyte of fresh pages each save
    costs more than copying into it.
    """
    leaves, treedef = jax.tree.flatten(tree)
    in_host_memory = [isinstance(x, np.ndarray) or (isinstance(x, jax.Array) and _on_cpu(x)) for x in leaves]
    remote = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and not in_host_memory[i]]
    if remote:
        picked = [leaves[i] for i in remote]
        for i, copy in zip(remote, _copy_on_device(picked) if on_device else jax.device_get(picked), strict=True):
            leaves[i] = copy
    local = [i for i, here in enumerate(in_host_memory) if here]
    for slot, i in enumerate(local):
        x = np.asarray(leaves[i])
        if slot >= len(pool):
            pool.append(np.empty(x.shape, x.dtype))
        elif pool[slot].shape != x.shape or pool[slot].dtype != x.dtype:
            pool[slot] = np.empty(x.shape, x.dtype)
        np.copyto(pool[slot], x)
        leaves[i] = pool[slot]
    return jax.tree.unflatten(treedef, leaves)


def _on_cpu(x: jax.Array) -> bool:
    return all(d.platform == "cpu" for d in x.devices())


@jax.jit
def _copy_on_device(arrays: list[jax.Array]) -> list[jax.Array]:
    """New device buffers holding the same values (inputs are not donated, so XLA cannot alias them)."""
    return [jnp.copy(x) for x in arrays]
