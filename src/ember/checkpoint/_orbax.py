"""`OrbaxStore`: the checkpoint store, with the arrays written and read by orbax-checkpoint."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
from flax import serialization

from ember.checkpoint._atomic import TMP_PREFIX, commit, fsync_dir
from ember.checkpoint._manifest import MANIFEST, check_structure, corrupt, new_manifest, write_manifest, wrong_store
from ember.checkpoint._snapshot import flat_leaves
from ember.checkpoint._store import CheckpointInfo, CheckpointStore

ITEM = "state"  # the orbax item inside each checkpoint folder


class OrbaxStore(CheckpointStore):
    """A ``CheckpointStore`` whose arrays go through orbax-checkpoint, for state sharded across processes.

    Everything else is the store's: the folder per checkpoint, the JSON manifest (step, metrics, metadata, leaf shapes
    and dtypes), the atomic commit of the whole folder, listing, ``latest``/``best``, retention and the
    [`Checkpoint`][ember.handlers.Checkpoint] handler on top. The difference is the data: orbax writes each process's
    shards of each array itself (no gather onto one host, so state larger than one host's memory can be saved) and
    restores them straight into the target's shardings. In a multi-process run every process must call ``save`` (orbax's
    save is collective); process 0 writes the manifest and commits. Orbax checks its own array files; the manifest
    carries its own CRC-32, as in the native store, and a folder without its orbax item is moved aside like a truncated
    checkpoint. Install with ``pip install 'ember[orbax]'``.

    Args:
        root: the folder; created if missing.

    Examples:
        >>> import tempfile, jax.numpy as jnp
        >>> from ember.checkpoint import OrbaxStore
        >>> store = OrbaxStore(tempfile.mkdtemp())
        >>> _ = store.save({"w": jnp.arange(3.0)}, step=1, metrics={"loss": 0.5})
        >>> tree, info = store.restore(target={"w": jnp.zeros(3)})
        >>> info.step, tree["w"].tolist()
        (1, [0.0, 1.0, 2.0])
        >>> store.close()
    """

    collective_saves = True

    def __init__(self, root: str | os.PathLike[str]) -> None:
        try:
            import orbax.checkpoint as ocp
        except ImportError as e:  # pragma: no cover - flax depends on orbax-checkpoint today
            raise ImportError("OrbaxStore needs orbax-checkpoint: pip install 'ember[orbax]'.") from e
        super().__init__(root)
        self._ocp = ocp
        self._checkpointer = ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler())

    def _prepare(
        self,
        tree: Any,
        step: int,
        metrics: Mapping[str, float] | None,
        metadata: Mapping[str, Any] | None,
        name: str | None,
    ) -> tuple[str, dict[str, Any], dict[str, Any]]:
        name = self._new_name(step, name)
        manifest = new_manifest(step, metrics, metadata, flat_leaves(tree))
        tmp = self.root / f"{TMP_PREFIX}{name}-orbax"  # the same on every process: orbax's save is collective
        if jax.process_index() == 0:
            tmp.mkdir()
        # orbax copies the arrays off the devices before this returns, and writes on its own threads
        self._checkpointer.save(tmp / ITEM, args=self._ocp.args.StandardSave(serialization.to_state_dict(tree)))
        return name, {"tmp": tmp}, manifest

    def _write(self, name: str, leaves: dict[str, Any], manifest: dict[str, Any]) -> CheckpointInfo:
        tmp: Path = leaves["tmp"]
        try:
            self._checkpointer.wait_until_finished()
            manifest["files"] = {ITEM: {"format": "orbax"}}
            if jax.process_index() == 0:
                write_manifest(tmp, manifest)
                fsync_dir(tmp)
                commit(tmp, self.root / name)
        except BaseException:
            if jax.process_index() == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        return CheckpointInfo(self.root / name, manifest["step"], manifest["metrics"], manifest)

    def _check_files(self, path: Path, manifest: dict[str, Any]) -> None:
        if ITEM not in manifest["files"]:
            raise ValueError(wrong_store(manifest, ITEM))
        if not (path / ITEM).is_dir():
            raise corrupt(path, ITEM, "folder is missing")

    def _read(self, info: CheckpointInfo, target: Any) -> Any:
        args = None
        if target is not None:
            check_structure(info.manifest["tree"], flat_leaves(target))
            abstract = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
                serialization.to_state_dict(target),
            )
            args = self._ocp.args.StandardRestore(abstract)
        try:
            restored = self._checkpointer.restore(info.path / ITEM, args=args)
        except Exception as e:
            raise corrupt(info.path, ITEM, f"cannot be read by orbax ({type(e).__name__}: {e})") from None
        return restored if target is None else serialization.from_state_dict(target, restored)

    def close(self) -> None:
        """Wait for writes in flight and stop orbax's threads.

        Examples:
            >>> import tempfile
            >>> from ember.checkpoint import OrbaxStore
            >>> OrbaxStore(tempfile.mkdtemp()).close()
        """
        self.wait()
        self._checkpointer.close()


def open_store(root: str | os.PathLike[str]) -> CheckpointStore:
    """The store for a folder: an ``OrbaxStore`` if orbax wrote its checkpoints, else a ``CheckpointStore``.

    Readers, ``ember inspect`` and the ``Checkpoint`` handler open a folder given by path this way.

    Examples:
        >>> import tempfile, numpy as np
        >>> from ember.checkpoint import CheckpointStore, open_store
        >>> folder = tempfile.mkdtemp()
        >>> _ = CheckpointStore(folder).save({"w": np.zeros(2)}, step=1)
        >>> type(open_store(folder)).__name__, open_store(folder).latest().step
        ('CheckpointStore', 1)
    """
    path = Path(root)
    orbax = path.is_dir() and any((c / ITEM).is_dir() and (c / MANIFEST).exists() for c in path.iterdir())
    return OrbaxStore(path) if orbax else CheckpointStore(path)
