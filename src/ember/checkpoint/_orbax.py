"""`OrbaxStore`: the checkpoint store, with the arrays written and read by orbax-checkpoint."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from flax import serialization

from ember._atomic_file import TMP_PREFIX, owner, temporary_name
from ember._extras import missing
from ember._multiprocess import exchange
from ember.checkpoint._contract import Draft, Writers
from ember.checkpoint._format import checksum_problem, flat_leaves, list_files, record, size_problem
from ember.checkpoint._manifest import (
    MANIFEST,
    CheckpointInfo,
    check_structure,
    corrupt,
    describe_tree,
    file_records,
    wrong_store,
)
from ember.checkpoint._shards import ShardFormat
from ember.checkpoint._store import CheckpointStore

ITEM = "state"  # the orbax item inside each checkpoint folder


class OrbaxStore(CheckpointStore):
    """A ``CheckpointStore`` whose arrays go through orbax-checkpoint, for state sharded across processes.

    Everything else is the store's: the folder per checkpoint, the JSON manifest (step, metrics, metadata, leaf shapes
    and dtypes), the atomic commit of the whole folder, listing, ``latest``/``best``, retention and the
    [`Checkpoint`][ember.handlers.Checkpoint] handler on top. The difference is the data: orbax writes each process's
    shards of each array itself (no gather onto one host, so state larger than one host's memory can be saved) and
    restores them straight into the target's shardings. In a multi-process run every process must call ``save`` and
    ``restore`` (both are collective); the folder must be on a file system every process sees.

    Every file orbax writes is recorded in the manifest with its size and CRC-32 when the checkpoint is committed
    (each process checksums its share of the files; process 0 writes the manifest). Listing checks the sizes; a
    restore, and ``ember inspect``, check every byte, each process its share, and all agree before anything is read:
    a checkpoint with a missing, truncated or altered file is moved aside (``corrupt-<name>``) with a warning and the
    previous one is used, as in the native store. A full disk raises ``OSError`` (``errno.ENOSPC``), so
    ``Checkpoint(on_error="warn")`` warns and trains on. Install with ``pip install -e ".[orbax]"``.

    Args:
        root: the folder (a relative path is taken from the working directory now); created if missing.

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

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__(root, format=OrbaxFormat(Path(os.path.abspath(root))))


class OrbaxFormat:
    """The arrays written and read by orbax-checkpoint: every process its shards, into one folder.

    ``prepare`` starts orbax's save (orbax copies the arrays off the devices before it returns and writes on its own
    threads); ``write`` waits for it and records this process's share of the files.
    """

    writers: Writers = "every"
    sharded = True

    def __init__(self, root: Path) -> None:
        try:
            import orbax.checkpoint as ocp
        except ImportError as e:  # pragma: no cover - flax depends on orbax-checkpoint today
            raise ImportError(missing("OrbaxStore", "orbax-checkpoint", "orbax")) from e
        self._ocp = ocp
        self._checkpointer = self._new_checkpointer()
        self._root = root
        self._writer_id: str | None = None  # process 0's owner id: it makes each save's folder (learnt at the first)
        self._saves = 0
        self._quiet: set[str] = set()  # the saves counted in _QUIET.writing
        _QUIET.folders.add(str(root / TMP_PREFIX))  # orbax's own error logs for ember's writes: raised instead

    def prepare(self, draft: Draft, tree: Any, root: Path, *, background: bool) -> None:
        draft.manifest["tree"] = describe_tree(flat_leaves(tree))
        # the same on every process (orbax's save is collective): process 0's, numbered by the saves so far
        if self._writer_id is None:
            self._writer_id = exchange(f"owner:{root}", owner())[0]
        draft.tmp = root / temporary_name(f"{draft.name}-orbax", self._writer_id, unique=self._saves)
        self._saves += 1
        self._quieting(draft, +1)  # until write has finished, or the save is abandoned
        try:
            if jax.process_index() == 0:
                draft.tmp.mkdir()
            state = serialization.to_state_dict(tree)
            self._checkpointer.save(draft.tmp / ITEM, args=self._ocp.args.StandardSave(state))
        except BaseException as e:
            self.abandon(draft)
            if jax.process_index() == 0:
                shutil.rmtree(draft.tmp, ignore_errors=True)
            raise _os_error(e) from None

    def write(self, draft: Draft, root: Path) -> dict[str, Any]:
        """Wait for orbax's write; return this process's share of its files' records (process 0's names the item)."""
        assert draft.tmp is not None  # made by prepare
        try:
            self._checkpointer.wait_until_finished()  # every process's files are written once this returns
            names = list_files(draft.tmp / ITEM)
            mine = record(draft.tmp / ITEM, names[jax.process_index() :: jax.process_count()])
        except BaseException as e:
            raise _os_error(e) from None  # quiet until the store has abandoned the save
        self._quieting(draft, -1)
        item = {ITEM: {"format": "orbax"}} if jax.process_index() == 0 else {}
        return item | {f"{ITEM}/{k}": v for k, v in mine.items()}

    def abandon(self, draft: Draft) -> None:
        """Drain the errors orbax's threads still hold, and go on with a new checkpointer.

        orbax keeps a failure of each of its writer threads (the arrays', the metadata's) and raises the next one at
        its next call, even a restore; a store whose save failed must not hand that to what comes after. orbax's
        threads are done with the folder when this returns.
        """
        old, self._checkpointer = self._checkpointer, self._new_checkpointer()
        for _ in range(4):  # each wait raises one kept error, and clears it
            try:
                old.close()
                break
            except Exception:  # the failure was raised already, by the save it belongs to
                continue
        self._quieting(draft, -1)

    def _quieting(self, draft: Draft, change: int) -> None:
        """Count ``draft`` among the saves whose orbax errors ember raises itself (+1), or no longer (-1, once)."""
        if (change > 0) != (draft.name in self._quiet):
            self._quiet.symmetric_difference_update({draft.name})
            _QUIET.saving(change)

    def _new_checkpointer(self) -> Any:
        return self._ocp.AsyncCheckpointer(self._ocp.StandardCheckpointHandler())

    def check_kind(self, path: Path, manifest: dict[str, Any]) -> None:
        if ITEM not in manifest["files"]:
            raise wrong_store(manifest, "OrbaxStore")
        if not (path / ITEM).is_dir():
            raise corrupt(path, ITEM, "folder is missing")

    def read(self, info: CheckpointInfo, target: Any, on_verified: Callable[[], object] | None) -> Any:
        args = self._ocp.args.StandardRestore()  # no target: the arrays as they were saved
        if target is not None:
            check_structure(info.manifest["tree"], flat_leaves(target))
            abstract = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
                serialization.to_state_dict(target),
            )
            args = self._ocp.args.StandardRestore(abstract)
        self._check_agreed(info)
        if on_verified is not None:
            on_verified()
        try:
            restored = self._checkpointer.restore(info.path / ITEM, args=args)
        except Exception as e:  # its files match their checksums: this is no damage, and nothing is moved aside
            raise RuntimeError(
                f"orbax could not read {info.path / ITEM}, although every file of it matches its size and CRC-32 "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})."
            ) from e
        return restored if target is None else serialization.from_state_dict(target, restored)

    def _check_agreed(self, info: CheckpointInfo) -> None:
        """Check every recorded file, each process its share, and raise the same error on every process if any fails."""
        records = file_records(info.manifest)
        problem = size_problem(info.path, records)  # every process stats every file: cheap, and the same answer
        if problem is None:
            names = sorted(records)
            mine = names[jax.process_index() :: jax.process_count()]
            problem = checksum_problem(info.path, {n: records[n] for n in mine})
        found = [json.loads(v) for v in exchange(f"restore:{self._root}", json.dumps(problem))]
        damage = next((p for p in found if p is not None), None)
        if damage is not None:
            raise corrupt(info.path, *damage)

    def close(self) -> None:
        self._checkpointer.close()


_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")


def _os_error(error: BaseException) -> BaseException:
    """An orbax or tensorstore failure that carries an OS error code, as that ``OSError``; others as they are."""
    if isinstance(error, OSError):
        return error
    found = _OS_ERROR_CODE.search(str(error))
    if found is None:
        return error
    code = int(found.group(1))
    return OSError(code, os.strerror(code))


class _QuietFilter(logging.Filter):
    """Drops orbax's warnings and errors about ember's writes, which ember raises itself.

    Those that name one of ember's temporary checkpoint folders (from orbax's loggers, and asyncio's for orbax's
    tasks), and, while one of ember's saves is in flight (``writing``), an orbax thread's logged ``OSError`` (a full
    disk's ENOSPC from a write or a flush names no file).
    """

    def __init__(self) -> None:
        super().__init__()
        self.folders: set[str] = set()
        self.writing = 0
        self._lock = threading.Lock()

    def saving(self, change: int) -> None:
        """One of ember's saves starts (+1) or is done with orbax's threads (-1)."""
        with self._lock:
            self.writing += change

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not self.folders:
            return True
        if self.writing and record.exc_info is not None and isinstance(record.exc_info[1], OSError):
            return False
        text = record.getMessage()
        return not any(folder in text for folder in self.folders)


_QUIET = _QuietFilter()
logging.getLogger("absl").addFilter(_QUIET)
# orbax's writes run as asyncio tasks; a failed one that orbax did not await (a full disk fails several at once) is
# logged by asyncio whenever it is collected ("Task exception was never retrieved"), naming ember's folder
logging.getLogger("asyncio").addFilter(_QUIET)


def open_store(root: str | os.PathLike[str]) -> CheckpointStore:
    """The store for a folder: an ``OrbaxStore`` if orbax wrote its checkpoints, else a ``CheckpointStore``.

    One process's folder of a [`TieredStore`][ember.checkpoint.TieredStore]'s fast tier is read as that tier reads it.

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
    if path.is_dir() and any((c / ITEM).is_dir() and (c / MANIFEST).exists() for c in path.iterdir()):
        return OrbaxStore(path)
    one = next((c / MANIFEST for c in path.iterdir() if (c / MANIFEST).is_file()), None) if path.is_dir() else None
    if one is not None and _has_layout(one):
        return CheckpointStore(path, format=ShardFormat())  # one process's folder of a TieredStore's fast tier
    return CheckpointStore(path)


def _has_layout(manifest: Path) -> bool:
    """Whether ``manifest`` is a fast tier's (it records the shards' layout)."""
    try:
        return "layout" in json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
