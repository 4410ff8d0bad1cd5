"""Restoring objects from a checkpoint: `load_objects`, and how each object of ``to_save`` is saved."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ember.checkpoint import CheckpointInfo, CheckpointStore, CorruptCheckpointError, open_store


def kind_of(name: str, obj: Any) -> str:
    """``"tree"`` or ``"state"``: how ``to_save[name]`` is saved; a ``TypeError`` naming it if neither."""
    if callable(getattr(obj, "tree_state_dict", None)):
        return "tree"  # contributes arrays (a training engine's train state), and maybe a state dict too
    if callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
        return "state"
    raise TypeError(
        f"`to_save[{name!r}]` must have state_dict()/load_state_dict() (an engine, a handler) or "
        f"tree_state_dict()/load_tree_state_dict() (a trainer); got {type(obj).__name__}."
    )


def load_objects(
    to_load: Mapping[str, Any],
    checkpoint: CheckpointInfo | CheckpointStore | str | os.PathLike[str],
    *,
    store: CheckpointStore | None = None,
) -> CheckpointInfo:
    """Restore ``to_load`` in place from a checkpoint: one checkpoint's folder, or a store (its latest valid one).

    ``checkpoint`` may name one checkpoint's folder (``runs/x/checkpoints/step_00000400``, as Ignite's ``--resume_from``
    passes it), a folder of checkpoints, a store, or a [`CheckpointInfo`][ember.checkpoint.CheckpointInfo]. Array trees
    are checked against the objects' current structure before anything is changed. A folder of orbax-written checkpoints
    is read through [`OrbaxStore`][ember.checkpoint.OrbaxStore]; ``store`` names the store a
    [`CheckpointInfo`][ember.checkpoint.CheckpointInfo] came from.

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
    if isinstance(checkpoint, str | os.PathLike) and (Path(checkpoint) / "manifest.json").is_file():
        checkpoint = _one_checkpoint(Path(checkpoint), store)  # Ignite's --resume_from: one checkpoint's folder
    if isinstance(checkpoint, CheckpointInfo):
        store, info = store or open_store(checkpoint.path.parent), checkpoint
    else:
        store = checkpoint if isinstance(checkpoint, CheckpointStore) else open_store(checkpoint)
        info = store.latest()
        if info is None:
            raise FileNotFoundError(f"No valid checkpoint in {store.root} to load from.")
    targets = {name: obj.tree_state_dict() for name, obj in to_load.items() if kinds[name] == "tree"}
    trees, info = store.restore(target=targets or None, checkpoint=info)
    states = info.manifest.get("metadata", {}).get("state_dicts", {})
    missing = [
        name for name, obj in to_load.items() if callable(getattr(obj, "load_state_dict", None)) and name not in states
    ]
    if missing:
        raise KeyError(f"The checkpoint {info.path.name!r} holds no state for {missing}; it holds {sorted(states)}.")
    for name, obj in to_load.items():
        if callable(getattr(obj, "load_state_dict", None)):
            obj.load_state_dict(states[name])
        if kinds[name] == "tree":
            obj.load_tree_state_dict(trees[name])
    return info


def _one_checkpoint(folder: Path, store: CheckpointStore | None) -> CheckpointInfo:
    """The checkpoint whose folder is ``folder``, read through the store of its parent folder."""
    store = store or open_store(folder.parent)
    for info in store.checkpoints():
        if info.path.resolve() == folder.resolve():
            return info
    raise CorruptCheckpointError(
        f"{str(folder)!r} holds a manifest but is not a valid checkpoint of {str(folder.parent)!r} (a write that "
        "never finished, or damaged files); load the folder of checkpoints instead to get its latest valid one."
    )
