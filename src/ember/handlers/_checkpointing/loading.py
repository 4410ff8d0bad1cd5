"""Restoring objects from a checkpoint: `load_objects`, and how each object of ``to_save`` is saved."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, overload

import jax
import numpy as np

from ember.checkpoint import CheckpointInfo, CorruptCheckpointError, open_store
from ember.checkpoint._store import Store, settle_writes_into
from ember.engine import Engine, Stateful, TreeStateful


def kind_of(name: str, obj: Any) -> str:
    """``"tree"`` or ``"state"``: how ``to_save[name]`` is saved; a ``TypeError`` naming it if neither."""
    if isinstance(obj, TreeStateful):
        return "tree"  # contributes arrays (a training engine's train state), and maybe a state dict too
    if isinstance(obj, Stateful):
        return "state"
    raise TypeError(
        f"`to_save[{name!r}]` must have state_dict()/load_state_dict() (an engine, a handler) or "
        f"tree_state_dict()/load_tree_state_dict() (a trainer); got {type(obj).__name__}."
    )


@overload
def load_objects(
    to_load: Mapping[str, Any], checkpoint: Mapping[str, Any], *, store: Store | None = None, strict: bool = True
) -> None: ...


@overload
def load_objects(
    to_load: Mapping[str, Any],
    checkpoint: CheckpointInfo | Store | str | os.PathLike[str],
    *,
    store: Store | None = None,
    strict: bool = True,
) -> CheckpointInfo: ...


def load_objects(
    to_load: Mapping[str, Any],
    checkpoint: CheckpointInfo | Store | Mapping[str, Any] | str | os.PathLike[str],
    *,
    store: Store | None = None,
    strict: bool = True,
) -> CheckpointInfo | None:
    """Restore ``to_load`` in place from one checkpoint's folder, a store (its latest valid one), or a dict.

    Array trees are restored into their current shapes, dtypes and shardings without a second copy: once the
    checkpoint has passed its checks, the arrays it replaces are deleted (as the next training step's donation would),
    and only then is it read, so that device memory holds one train state at any time. ``checkpoint`` may name one
    checkpoint's folder (``runs/x/checkpoints/step_00000400``, as Ignite's ``--resume_from``
    passes it), a folder of checkpoints, a store, or a [`CheckpointInfo`][ember.checkpoint.CheckpointInfo]. Array trees
    are checked against the objects' current structure before anything is changed. A folder of orbax-written checkpoints
    is read through [`OrbaxStore`][ember.checkpoint.OrbaxStore]; ``store`` names the store a
    [`CheckpointInfo`][ember.checkpoint.CheckpointInfo] came from.

    A dict is a checkpoint as a save handler of yours received it (Ignite's in-memory ``load_objects``): each
    object's state dict by name, a trainer's as ``{"state_dict": ..., "tree_state_dict": {path: array}}``; with a
    single object in ``to_load``, the dict may be that object's state itself. ``None`` is returned for it.

    ``strict=False`` is Ignite's (its ``load_state_dict(strict=False)``, for transfer learning): an array of a trainer
    that the checkpoint lacks keeps its current value, and an array of the checkpoint that the trainer lacks is left
    unread; a ``UserWarning`` names both. An array whose shape or dtype differs is still refused, as is an object of
    ``to_load`` the checkpoint holds nothing for. Such a load reads the checkpoint into host memory first (the current
    arrays are kept for what it lacks). To choose what to take, rename or leave layers fresh, use
    [`init_from`][ember.checkpoint.init_from].

    Examples:
        >>> import tempfile
        >>> from ember import Engine
        >>> from ember.handlers import Checkpoint, load_objects
        >>> trainer = Engine(lambda e, b: b)
        >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp(), background=False)
        >>> _ = trainer.run([1, 2, 3]); saver(trainer)
        >>> fresh = Engine(lambda e, b: b)
        >>> load_objects({"trainer": fresh}, saver.store).step, fresh.state.iteration
        (3, 3)
    """
    kinds = {name: kind_of(name, obj) for name, obj in to_load.items()}
    running = [name for name, obj in to_load.items() if isinstance(obj, Engine) and obj.running]
    if running:  # refused before anything is read or released: the run goes on with its own arrays
        raise RuntimeError(
            f"load_objects: {running} is running; load a checkpoint before run() (or after it returns), not from "
            "one of its handlers."
        )
    if not isinstance(strict, bool):
        raise TypeError(f"`strict` must be True or False, got {strict!r}.")
    if isinstance(checkpoint, Mapping):
        _load_from_dict(to_load, checkpoint, strict)
        return None
    if isinstance(checkpoint, str | os.PathLike):
        settle_writes_into(Path(checkpoint))  # a checkpoint of this process still being written: its files first
        if not Path(checkpoint).exists():
            raise FileNotFoundError(f"No valid checkpoint in {checkpoint} to load from: there is no such folder.")
    if isinstance(checkpoint, str | os.PathLike) and (Path(checkpoint) / "manifest.json").is_file():
        checkpoint = _one_checkpoint(Path(checkpoint), store)  # Ignite's --resume_from: one checkpoint's folder
    if isinstance(checkpoint, CheckpointInfo):
        store, info = store or open_store(checkpoint.path.parent), checkpoint
    else:
        store = checkpoint if isinstance(checkpoint, Store) else open_store(checkpoint)
        info = store.latest()
        if info is None:
            raise FileNotFoundError(f"No valid checkpoint in {store.root} to load from.")
    live = {name: obj.tree_state_dict() for name, obj in to_load.items() if kinds[name] == "tree"}
    if strict:
        trees, info = _restore_in_place(store, info, live)
    else:  # read to the host, then matched path by path
        saved, info = store.restore(None, info)
        where = f"The checkpoint {info.path.name!r}"
        trees = {name: _fitted(name, saved.get(name), tree, False, where) for name, tree in live.items()}
    states = info.manifest.get("metadata", {}).get("state_dicts", {})
    missing = [name for name, obj in to_load.items() if isinstance(obj, Stateful) and name not in states]
    if missing:
        raise ValueError(f"The checkpoint {info.path.name!r} holds no state for {missing}; it holds {sorted(states)}.")
    for name, obj in to_load.items():
        if isinstance(obj, Stateful):
            obj.load_state_dict(states[name])
        if isinstance(obj, TreeStateful):
            obj.load_tree_state_dict(trees[name])
    return info


def _restore_in_place(
    store: Store, info: CheckpointInfo, live: dict[str, dict[str, Any]]
) -> tuple[dict[str, Any], CheckpointInfo]:
    """``info``'s trees restored into ``live``'s shapes and shardings, the live arrays freed once it checked out."""
    released = False

    def release() -> None:  # the checkpoint checked out: free the arrays it replaces before reading it
        nonlocal released
        released = True
        for tree in live.values():
            for leaf in tree.values():
                if isinstance(leaf, jax.Array) and not leaf.is_deleted():
                    leaf.delete()

    try:
        trees, info = store.restore(
            target={name: abstract(tree) for name, tree in live.items()} or None, checkpoint=info, on_verified=release
        )
    except Exception as e:
        if released:
            raise RuntimeError(
                f"Restoring {info.path} failed after the current arrays of {sorted(live)} were released to make "
                f"room for it ({type(e).__name__}: {e}); build those objects again before using them."
            ) from e
        raise
    return trees, info


def _load_from_dict(to_load: Mapping[str, Any], checkpoint: Mapping[str, Any], strict: bool) -> None:
    """Restore from a checkpoint dict, every entry checked before any object changes."""
    if len(to_load) == 1 and next(iter(to_load)) not in checkpoint:
        checkpoint = {next(iter(to_load)): checkpoint}  # a single object's state, as Ignite saves it
    missing = sorted(set(to_load) - set(checkpoint))
    if missing:
        raise ValueError(f"The checkpoint holds no state for {missing}; it holds {sorted(checkpoint)}.")
    trees = {}
    for name, obj in to_load.items():
        entry = checkpoint[name]
        if isinstance(obj, TreeStateful):
            needed = ["tree_state_dict"] + (["state_dict"] if isinstance(obj, Stateful) else [])
            if not isinstance(entry, Mapping) or any(k not in entry for k in needed):
                got = sorted(entry) if isinstance(entry, Mapping) else type(entry).__name__
                raise ValueError(f"`checkpoint[{name!r}]` must hold {needed} (a trainer's entry); it holds {got}.")
            where = f"`checkpoint[{name!r}]['tree_state_dict']`"
            trees[name] = _fitted(name, entry["tree_state_dict"], obj.tree_state_dict(), strict, where)
    for name, obj in to_load.items():
        entry = checkpoint[name]
        if isinstance(obj, TreeStateful):
            if isinstance(obj, Stateful):
                obj.load_state_dict(entry["state_dict"])
            obj.load_tree_state_dict(trees[name])
        elif isinstance(obj, Stateful):
            obj.load_state_dict(entry)


def _fitted(
    name: str, saved: Mapping[str, Any] | None, live: Mapping[str, Any], strict: bool, where: str
) -> dict[str, Any]:
    """``saved`` checked against ``live``; with ``strict=False``, ``live``'s leaves where ``saved`` lacks them.

    Raises ``ValueError`` naming every path, shape and dtype that differs (and, when ``strict``, every path one of them
    lacks); without ``strict`` a ``UserWarning`` names the paths kept as they were and those left unread.
    """
    if saved is None:
        raise ValueError(f"{where} holds no arrays for {name!r}.")
    missing, unexpected = sorted(set(live) - set(saved)), sorted(set(saved) - set(live))
    problems = [f"missing: {p}" for p in missing] + [f"not in {name}: {p}" for p in unexpected] if strict else []
    for path in sorted(set(saved) & set(live)):
        want, got = live[path], saved[path]
        if hasattr(want, "shape") and (np.shape(got) != tuple(want.shape) or np.result_type(got) != want.dtype):
            problems.append(
                f"{path}: the checkpoint has {np.result_type(got)}{list(np.shape(got))}, "
                f"{name} {np.dtype(want.dtype)}{list(want.shape)}"
            )
    if problems:
        raise ValueError(f"{where} does not fit {name}: " + "; ".join(problems[:20]))
    if missing or unexpected:
        warnings.warn(
            f"load_objects(strict=False): {name!r} keeps {len(missing)} of its arrays as they were, not in the "
            f"checkpoint {_few(missing)}, and {len(unexpected)} of the checkpoint's are not in {name!r} "
            f"{_few(unexpected)}.",
            UserWarning,
            stacklevel=4,
        )
    return {path: saved.get(path, leaf) for path, leaf in live.items()}


def _few(paths: list[str]) -> str:
    """``(a, b, c, ... and 5 more)``: the first paths of a list, for a warning of one line."""
    shown = ", ".join(paths[:6]) + (f", ... and {len(paths) - 6} more" if len(paths) > 6 else "")
    return f"({shown})" if paths else ""


def abstract(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` with each device array as a ``jax.ShapeDtypeStruct`` of its shape, dtype and sharding.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.handlers._checkpointing.loading import abstract
        >>> abstract({"w": jnp.zeros((2, 3)), "n": 3})["w"].shape
        (2, 3)
    """
    return {
        path: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) if isinstance(x, jax.Array) else x
        for path, x in tree.items()
    }


def _one_checkpoint(folder: Path, store: Store | None) -> CheckpointInfo:
    """The checkpoint whose folder is ``folder``, read through the store of its parent folder."""
    store = store or open_store(folder.parent)
    for info in store.checkpoints():
        if info.path.resolve() == folder.resolve():
            return info
    raise CorruptCheckpointError(
        f"{str(folder)!r} holds a manifest but is not a valid checkpoint of {str(folder.parent)!r} (a write that "
        "never finished, or damaged files); load the folder of checkpoints instead to get its latest valid one."
    )
