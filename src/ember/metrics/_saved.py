"""Metric accumulators as exact JSON, so a checkpoint's manifest can carry them with the engine's state."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils


def encode_tree(tree: Any) -> Any:
    """``tree`` (tuples, lists, dicts of arrays and Python scalars, ``None``) as JSON that `decode_tree` reads.

    Floats go through Python floats, which hold every float16/bfloat16/float32/float64 value exactly;
    NumPy arrays come back as NumPy arrays, device arrays as device arrays; an array sharded across
    processes is gathered first (every process calls this, as a checkpoint does). Anything else raises
    ``TypeError``.

    Examples:
        >>> import numpy as np
        >>> from ember.metrics._saved import decode_tree, encode_tree
        >>> saved = encode_tree((np.float32(0.1), {"n": np.arange(2)}))
        >>> back = decode_tree(saved)
        >>> type(back[0]).__name__, back[0].dtype, bool(back[0] == np.float32(0.1)), back[1]["n"].tolist()
        ('ndarray', dtype('float32'), True, [0, 1])
    """
    if tree is None or isinstance(tree, bool | int | float | str):
        return tree
    if isinstance(tree, tuple):
        return {"tuple": [encode_tree(x) for x in tree]}
    if isinstance(tree, list):
        return {"list": [encode_tree(x) for x in tree]}
    if isinstance(tree, dict):
        return {"dict": {str(k): encode_tree(v) for k, v in tree.items()}}
    if not isinstance(tree, jax.Array | np.ndarray | np.generic):
        raise TypeError(f"Cannot save a {type(tree).__name__} as a metric value or state.")
    on_host = not isinstance(tree, jax.Array)
    if isinstance(tree, jax.Array) and not tree.is_fully_addressable:
        tree = multihost_utils.process_allgather(tree, tiled=True)
    array = np.asarray(jax.device_get(tree))
    saved = {"dtype": array.dtype.name, "shape": list(array.shape), "data": array.ravel().tolist()}
    return {**saved, "numpy": True} if on_host else saved


def decode_tree(saved: Any) -> Any:
    """The tree `encode_tree` saved, with device arrays of the saved dtypes and shapes."""
    if saved is None or isinstance(saved, bool | int | float | str):
        return saved
    if not isinstance(saved, dict) or len(saved) not in (1, 3, 4):
        raise ValueError(f"Not a saved metric state: {saved!r}.")
    if "tuple" in saved:
        return tuple(decode_tree(x) for x in saved["tuple"])
    if "list" in saved:
        return [decode_tree(x) for x in saved["list"]]
    if "dict" in saved:
        return {k: decode_tree(v) for k, v in saved["dict"].items()}
    try:
        array = np.asarray(saved["data"], dtype=np.dtype(saved["dtype"])).reshape(saved["shape"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"Not a saved metric array ({e}): {saved!r}.") from None
    return array if saved.get("numpy") else jnp.asarray(array)


class PublishedValues:
    """An engine's ``state.metrics``, saved with the engine, so a resumed run's handlers read what they would have.

    A checkpoint taken at an epoch's last iteration is resumed at that epoch's EPOCH_COMPLETED, before any
    step has published a running average; mid-epoch, the last epoch's values are still what a logger
    reads. Values that are neither numbers nor arrays are not saved.
    """

    def __init__(self, metrics: dict[str, Any]) -> None:
        self.metrics = metrics

    def state_dict(self) -> dict[str, Any]:
        saved = {}
        for name, value in self.metrics.items():
            try:
                saved[name] = encode_tree(value)
            except TypeError:
                continue
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.metrics.update({name: decode_tree(value) for name, value in state_dict.items()})


def is_global(state: Any) -> bool:
    """Whether the accumulators are arrays spanning every process already (so merging would double count)."""
    leaves = jax.tree.leaves(state)
    return bool(leaves) and all(isinstance(x, jax.Array) and not x.is_fully_addressable for x in leaves)


def distinct_buffers(state: Any) -> Any:
    """``state`` with no buffer used twice (``(zero, zero)``), so an engine can donate it to a compiled step."""
    seen: set[int] = set()

    def unique(x: Any) -> Any:
        if id(x) in seen:
            return jnp.array(x, copy=True)
        seen.add(id(x))
        return x

    return jax.tree.map(unique, state)


def own_part(
    kind: str,
    saved: Any,
    fresh: Any,
    merge_processes: Callable[[list[Any]], Any],
    empty: Callable[[], Any],
) -> tuple[Any, int]:
    """``(accumulators, updates)`` this process takes from a metric's ``state_dict`` (``Metric.load_state_dict``).

    Saved from several processes (``"processes"``), each takes its own part; resumed on another number of processes,
    process 0 takes the parts merged (``merge_processes``) and the others ``empty()``, with every count the total.
    Each part is checked against ``fresh`` (the metric's ``empty()``): a part of another kind of metric is refused.
    """
    if not (isinstance(saved, Mapping) and "processes" in saved):
        return _checked(kind, saved, fresh)
    parts = saved["processes"]
    if not isinstance(parts, list) or not parts or not all(isinstance(p, Mapping) for p in parts):
        raise ValueError(f"`state_dict['processes']` of {kind} must be a non-empty list of saved parts, got {parts!r}.")
    if len(parts) == jax.process_count():
        return _checked(kind, parts[jax.process_index()], fresh)
    checked = [_checked(kind, part, fresh) for part in parts]  # another number of processes: merged on process 0
    updates = sum(n for _, n in checked)
    return (merge_processes([s for s, _ in checked]) if jax.process_index() == 0 else empty()), updates


def _checked(kind: str, saved: Any, fresh: Any) -> tuple[Any, int]:
    """``(accumulators, updates)`` from one saved part, checked against a metric's ``empty()`` (``fresh``)."""
    if not isinstance(saved, Mapping) or "state" not in saved or "updates" not in saved:
        raise ValueError(f"`state_dict` of {kind} must hold 'state' and 'updates', got {saved!r}.")
    updates = saved["updates"]
    if not isinstance(updates, int) or isinstance(updates, bool) or updates < 0:
        raise ValueError(f"`state_dict['updates']` must be a non-negative int, got {updates!r}.")
    state = decode_tree(saved["state"])
    if fresh is not None and jax.tree.structure(fresh) != jax.tree.structure(state):
        raise ValueError(
            f"The saved state of {kind} has the structure {jax.tree.structure(state)}, this metric "
            f"{jax.tree.structure(fresh)}; was it saved by another kind of metric?"
        )
    return state, updates
