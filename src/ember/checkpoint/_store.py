"""`CheckpointStore`: save, list, find and restore verified checkpoints in one folder."""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jax
import numpy as np
from flax import serialization, traverse_util

from ember.checkpoint._atomic import TMP_PREFIX, commit, temporary_dir
from ember.checkpoint._format import lower_thread_priority, read_leaves, write_leaves
from ember.checkpoint._manifest import (
    MANIFEST,
    CorruptCheckpointError,
    check_structure,
    corrupt,
    new_manifest,
    read_manifest,
    write_manifest,
    wrong_store,
)
from ember.checkpoint._snapshot import check_gatherable, detach, flat_leaves, on_host

DATA = "state.msgpack"
CORRUPT_PREFIX = "corrupt-"  # a checkpoint that failed verification, moved aside (never deleted)


@dataclass(frozen=True)
class CheckpointInfo:
    """One verified checkpoint on disk: its folder, step, metrics and manifest.

    Examples:
        >>> import tempfile, numpy as np
        >>> from ember.checkpoint import CheckpointStore
        >>> store = CheckpointStore(tempfile.mkdtemp())
        >>> info = store.save({"w": np.ones(2)}, step=7, metrics={"loss": 0.5})
        >>> info.step, info.metrics, info.path.name
        (7, {'loss': 0.5}, 'step_00000007')
    """

    path: Path
    step: int
    metrics: dict[str, float]
    manifest: dict[str, Any]


class CheckpointStore:
    """Checkpoints in one folder, each committed atomically and verified before it is ever returned.

    A checkpoint is a folder holding ``state.msgpack`` (the tree, streamed leaf by leaf) and
    ``manifest.json`` (step, metrics, wall time, ember version, each leaf's path, shape and dtype, and
    the size and CRC-32 of the data file). It is written under a temporary name in the same folder,
    fsynced, renamed into place, and the folder is fsynced: a crash leaves either a complete checkpoint or
    a temporary folder, which the next store opened on the folder removes. Files get the permissions the
    umask allows.

    In a multi-process run only process 0 writes and deletes (the others get the info back from ``save``
    and read the same folder, which must be on a shared file system to restore on every process).

    A checkpoint that is incomplete or corrupt (missing manifest, truncated data, bad checksum) is never
    returned: :meth:`latest`, :meth:`best` and :meth:`restore` skip it with a warning that names it and
    says why, and fall back to the newest valid one.

    Background saves (:meth:`save_in_background`) copy the state to the host before they return, so the
    training thread waits for that copy (on a GPU the queued steps finish first, then the copy runs).
    ``device_snapshot=True`` copies it on the device instead, which returns at once, and the writer thread
    fetches the copy while training goes on: training loses no time to the transfer, at the price of one
    more copy of the state in device memory while it lasts. On the CPU backend both are the same copy.

    Args:
        root: the folder; created if missing.
        device_snapshot: snapshot accelerator arrays on the device rather than on the host (see above).

    Examples:
        >>> import tempfile, numpy as np
        >>> from ember.checkpoint import CheckpointStore
        >>> store = CheckpointStore(tempfile.mkdtemp())
        >>> _ = store.save({"w": np.arange(3.0)}, step=1)
        >>> _ = store.save({"w": np.arange(3.0) * 2}, step=2)
        >>> tree, info = store.restore()
        >>> info.step, tree["w"].tolist()
        (2, [0.0, 2.0, 4.0])
    """

    def __init__(self, root: str | os.PathLike[str], *, device_snapshot: bool = False) -> None:
        if not isinstance(device_snapshot, bool):
            raise TypeError(f"`device_snapshot` must be True or False, got {device_snapshot!r}.")
        self.device_snapshot = device_snapshot
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        for leftover in self.root.glob(f"{TMP_PREFIX}*"):  # an interrupted write
            shutil.rmtree(leftover, ignore_errors=True)
        self._writer: ThreadPoolExecutor | None = None
        self._pending: Future[CheckpointInfo] | None = None
        self._host_buffers: list[np.ndarray] = []  # reused by background saves (see detach)

    # -- writing ---------------------------------------------------------------------------------

    def save(
        self,
        tree: Any,
        *,
        step: int,
        metrics: Mapping[str, float] | None = None,
        metadata: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> CheckpointInfo:
        """Write ``tree`` (a pytree of arrays and scalars) as a new checkpoint; return its info.

        Waits for a background save still in flight first (see :meth:`save_in_background`).

        Args:
            tree: what to save; device arrays are copied to the host first.
            step: the training step it belongs to.
            metrics: numbers to rank checkpoints by (``best``).
            metadata: any JSON-serialisable extras (an engine's ``state_dict()``).
            name: the folder name; ``step_<step>`` by default.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> store.save({"w": np.zeros(2)}, step=3, name="step_3-loss=0.1").path.name
            'step_3-loss=0.1'
        """
        elsewhere = self._start_save(tree, step, metrics, name)
        if elsewhere is not None:
            return elsewhere
        return self._write(*self._prepare(tree, step, metrics, metadata, name))

    def save_in_background(
        self,
        tree: Any,
        *,
        step: int,
        metrics: Mapping[str, float] | None = None,
        metadata: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> Future[CheckpointInfo]:
        """Copy ``tree`` now, then serialise and write it on a background thread.

        When this returns, training may change the device state freely: what is saved is already a copy of
        its own, on the host (or, with ``device_snapshot=True``, on the device, fetched by the writer). The
        write runs on one background thread; the next save (of either kind) first waits for it, and
        re-raises its error if it failed, as do :meth:`wait` and :meth:`raise_if_failed`.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> future = store.save_in_background({"w": np.ones(2)}, step=1)
            >>> store.wait().step, future.result().path.name
            (1, 'step_00000001')
        """
        elsewhere = self._start_save(tree, step, metrics, name)
        if elsewhere is not None:
            self._pending = Future()
            self._pending.set_result(elsewhere)
            return self._pending
        if not self.collective_saves:  # a collective store (orbax) takes its own copy, shard by shard
            tree = detach(tree, self._host_buffers, on_device=self.device_snapshot)
        prepared = self._prepare(tree, step, metrics, metadata, name)
        if self._writer is None:
            self._writer = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="ember-checkpoint", initializer=lower_thread_priority
            )
        self._pending = self._writer.submit(self._write, *prepared)
        return self._pending

    #: Whether every process takes part in a save (orbax) or only process 0 writes (this store).
    collective_saves = False

    def _start_save(
        self, tree: Any, step: int, metrics: Mapping[str, float] | None, name: str | None
    ) -> CheckpointInfo | None:
        """Wait for the previous save and check ``tree``; return ``None`` where this process writes.

        On a process other than 0 (which writes nothing) it returns the info the save would have.
        """
        self.wait()
        if self.collective_saves:
            return None
        check_gatherable(tree)  # on every process, so all of them fail alike
        if jax.process_index() == 0:
            return None
        return CheckpointInfo(
            self.root / (name or f"step_{step:08d}"),
            step,
            {k: float(v) for k, v in (metrics or {}).items()},
            {"step": step, "written_by": "process 0"},
        )

    def wait(self) -> CheckpointInfo | None:
        """Block until a background save is on disk; re-raise its error; return its info (or ``None``).

        Examples:
            >>> import tempfile
            >>> from ember.checkpoint import CheckpointStore
            >>> CheckpointStore(tempfile.mkdtemp()).wait() is None
            True
        """
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else None

    @property
    def writing(self) -> bool:
        """Whether a background save was started and not yet waited for.

        Examples:
            >>> import tempfile
            >>> from ember.checkpoint import CheckpointStore
            >>> CheckpointStore(tempfile.mkdtemp()).writing
            False
        """
        return self._pending is not None

    def raise_if_failed(self) -> None:
        """Re-raise the error of a background save that has already failed; never blocks.

        Examples:
            >>> import tempfile
            >>> from ember.checkpoint import CheckpointStore
            >>> CheckpointStore(tempfile.mkdtemp()).raise_if_failed()
        """
        pending = self._pending
        if pending is not None and pending.done() and pending.exception() is not None:
            self._pending = None
            raise pending.exception()  # type: ignore[misc]

    def _prepare(
        self,
        tree: Any,
        step: int,
        metrics: Mapping[str, float] | None,
        metadata: Mapping[str, Any] | None,
        name: str | None,
    ) -> tuple[str, dict[str, Any], dict[str, Any]]:
        name = self._new_name(step, name)
        leaves = flat_leaves(tree)
        return name, leaves, new_manifest(step, metrics, metadata, leaves)

    def _new_name(self, step: int, name: str | None) -> str:
        """Check ``step`` and ``name``; return the folder name of a new checkpoint."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"`step` must be a non-negative int, got {step!r}.")
        name = name or f"step_{step:08d}"
        if "/" in name or name.startswith("."):
            raise ValueError(f"`name` must be a plain folder name, got {name!r}.")
        if (self.root / name).exists():
            try:
                self.verify(self.root / name)
            except CorruptCheckpointError as why:  # a damaged checkpoint of this step: out of the way
                self.set_aside(self.root / name, why)
                return name
            except ValueError:
                pass
            raise FileExistsError(f"A checkpoint named {name!r} already exists in {self.root}.")
        return name

    def _write(self, name: str, leaves: dict[str, Any], manifest: dict[str, Any]) -> CheckpointInfo:
        leaves = on_host(leaves)  # device snapshots (or, saving in the foreground, the state) come over here
        tmp = temporary_dir(self.root, name)
        try:
            with open(tmp / DATA, "wb") as f:
                size, crc = write_leaves(f, list(leaves.items()))
                f.flush()
                os.fsync(f.fileno())
            manifest["files"] = {DATA: {"bytes": size, "crc32": crc}}
            write_manifest(tmp, manifest)
            commit(tmp, self.root / name)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return CheckpointInfo(self.root / name, manifest["step"], manifest["metrics"], manifest)

    def prune(
        self,
        *,
        keep_latest: int | None = None,
        keep_best: int | None = None,
        metric: str | None = None,
        mode: Literal["min", "max"] = "max",
        keep_every: int | None = None,
        prefix: str = "",
    ) -> list[CheckpointInfo]:
        """Delete the checkpoints (named with ``prefix``) that no policy keeps; return them.

        The policies combine: a checkpoint stays if it is among the ``keep_latest`` highest steps, or among
        the ``keep_best`` best by ``metric`` (``mode``), or its step is a multiple of ``keep_every``. So the
        latest checkpoints are kept beside the best ones (orbax #526). With no policy at all nothing is
        deleted.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> for step, loss in ((1, 0.1), (2, 0.5), (3, 0.4), (4, 0.3)):
            ...     _ = store.save({"w": np.zeros(1)}, step=step, metrics={"loss": loss})
            >>> _ = store.prune(keep_latest=1, keep_best=1, metric="loss", mode="min")
            >>> [c.step for c in store.checkpoints()]
            [1, 4]
        """
        check_retention(keep_latest, keep_best, keep_every, mode)
        if keep_best is not None and metric is None:
            raise ValueError("`keep_best` needs `metric`, the name of the score to rank checkpoints by.")
        if (keep_latest is None and keep_best is None and keep_every is None) or jax.process_index() != 0:
            return []  # no policy: keep everything; and only process 0 deletes
        mine = [c for c in self.checkpoints() if c.path.name.startswith(prefix)]
        kept: set[Path] = set()
        if keep_latest:
            kept |= {c.path for c in sorted(mine, key=_newer)[-keep_latest:]}
        if keep_best and metric is not None:
            sign = 1.0 if mode == "max" else -1.0
            scored = sorted((c for c in mine if metric in c.metrics), key=lambda c: (sign * c.metrics[metric], c.step))
            kept |= {c.path for c in scored[-keep_best:]}
        if keep_every:
            kept |= {c.path for c in mine if c.step % keep_every == 0}
        doomed = [c for c in mine if c.path not in kept]
        for c in doomed:
            self.delete(c)
        return doomed

    def delete(self, info: CheckpointInfo) -> None:
        """Remove a checkpoint (renamed to a temporary name first, so a crash never leaves half of one)."""
        doomed = self.root / f"{TMP_PREFIX}deleting-{info.path.name}"
        os.replace(info.path, doomed)
        shutil.rmtree(doomed)

    # -- finding ---------------------------------------------------------------------------------

    def _candidates(self) -> list[Path]:
        return sorted(
            p
            for p in self.root.iterdir()
            if p.is_dir() and not p.name.startswith(".") and not p.name.startswith(CORRUPT_PREFIX)
        )

    def verify(self, path: str | os.PathLike[str]) -> CheckpointInfo:
        """The info of the checkpoint in folder ``path``, once its manifest and file sizes check out.

        Raises:
            CorruptCheckpointError: the checkpoint is damaged (the message names the folder and the file).
            ValueError: the folder holds no checkpoint of this store's kind.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> info = store.save({"w": np.zeros(1)}, step=4)
            >>> store.verify(info.path).step
            4
        """
        path = Path(path)
        try:
            manifest = read_manifest(path)
        except FileNotFoundError:
            raise ValueError("it has no manifest (it is not a checkpoint, or its write did not finish)") from None
        self._check_files(path, manifest)
        return CheckpointInfo(path, manifest["step"], dict(manifest["metrics"]), manifest)

    def _check_files(self, path: Path, manifest: dict[str, Any]) -> None:
        """Raise unless the checkpoint's data files are all there, whole."""
        expected = manifest["files"].get(DATA)
        if not isinstance(expected, dict) or not isinstance(expected.get("bytes"), int):
            raise ValueError(wrong_store(manifest, DATA))
        data = path / DATA
        if not data.exists():
            raise corrupt(path, DATA, "is missing")
        size = data.stat().st_size
        if size != expected["bytes"]:
            raise corrupt(path, DATA, f"holds {size} bytes, the manifest says {expected['bytes']} (truncated)")

    def set_aside(self, path: Path, why: Exception) -> None:
        """Move a checkpoint that failed verification out of the way (renamed ``corrupt-<name>``), with a warning.

        Nothing is deleted: the folder stays for a person to inspect. A later save of the same step can
        then be written. Only process 0 renames; every process warns.

        Examples:
            >>> import tempfile, warnings, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> info = store.save({"w": np.zeros(1)}, step=1)
            >>> with warnings.catch_warnings(record=True) as caught:
            ...     warnings.simplefilter("always")
            ...     store.set_aside(info.path, ValueError("Checkpoint step_00000001 is damaged."))
            >>> [p.name for p in store.root.iterdir()]
            ['corrupt-step_00000001']
            >>> print(caught[0].message)
            Checkpoint step_00000001 is damaged. It was moved aside to 'corrupt-step_00000001' and skipped.
        """
        moved = self.root / f"{CORRUPT_PREFIX}{path.name}"
        n = 1
        while moved.exists():
            n += 1
            moved = self.root / f"{CORRUPT_PREFIX}{path.name}.{n}"
        warnings.warn(f"{why} It was moved aside to {moved.name!r} and skipped.", UserWarning, stacklevel=3)
        if jax.process_index() == 0 and path.exists():
            os.replace(path, moved)

    def checkpoints(self) -> list[CheckpointInfo]:
        """Every checkpoint whose manifest and data size check out, oldest step first (no warnings).

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> for s in (5, 1, 3):
            ...     _ = store.save({"w": np.zeros(1)}, step=s)
            >>> [c.step for c in store.checkpoints()]
            [1, 3, 5]
        """
        found = []
        for path in self._candidates():
            try:
                found.append(self.verify(path))
            except ValueError:
                continue
        return sorted(found, key=_newer)

    def ranked(self, metric: str | None = None, mode: Literal["min", "max"] = "max") -> list[CheckpointInfo]:
        """Valid checkpoints, preferred first: newest step first, or best by ``metric`` first (``mode``).

        Damaged ones are moved aside with a warning (:meth:`set_aside`); with ``metric``, checkpoints
        without it are left out. Ties go to the later step.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> for step, acc in ((1, 0.7), (2, 0.9), (3, 0.8)):
            ...     _ = store.save({"w": np.zeros(1)}, step=step, metrics={"acc": acc})
            >>> [c.step for c in store.ranked()], [c.step for c in store.ranked("acc")]
            ([3, 2, 1], [2, 3, 1])
        """
        if mode not in ("min", "max"):
            raise ValueError(f"`mode` must be 'min' or 'max', got {mode!r}.")
        found = []
        for path in self._candidates():
            try:
                found.append(self.verify(path))
            except CorruptCheckpointError as why:
                self.set_aside(path, why)
            except ValueError as why:
                warnings.warn(f"Skipping checkpoint {path.name!r}: {why}.", UserWarning, stacklevel=3)
        newest_first = sorted(found, key=_newer, reverse=True)
        if metric is None:
            return newest_first
        sign = 1.0 if mode == "max" else -1.0
        scored = [c for c in newest_first if metric in c.metrics]
        return sorted(scored, key=lambda c: (sign * c.metrics[metric], c.step), reverse=True)

    def latest(self) -> CheckpointInfo | None:
        """The valid checkpoint with the highest step, or ``None``; invalid ones are skipped with a warning.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> store.latest() is None
            True
        """
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def best(self, metric: str, mode: Literal["min", "max"] = "max") -> CheckpointInfo | None:
        """The valid checkpoint with the best value of ``metric`` (ties: the later step), or ``None``.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> for step, acc in ((1, 0.7), (2, 0.9), (3, 0.8)):
            ...     _ = store.save({"w": np.zeros(1)}, step=step, metrics={"accuracy": acc})
            >>> store.best("accuracy").step, store.best("accuracy", mode="min").step
            (2, 1)
        """
        ranked = self.ranked(metric, mode)
        return ranked[0] if ranked else None

    # -- reading ---------------------------------------------------------------------------------

    def restore(self, target: Any = None, checkpoint: CheckpointInfo | None = None) -> tuple[Any, CheckpointInfo]:
        """Read a checkpoint (the latest valid one by default), verified against its checksum.

        With ``target``, the tree is restored into its structure (``flax.serialization``), after checking that
        every path, shape and dtype matches; otherwise a nested dict of NumPy arrays comes back. When the
        latest checkpoint turns out corrupt, it is skipped with a warning and the next newest one is read.

        Raises:
            FileNotFoundError: there is no valid checkpoint.
            ValueError: ``target`` does not match the saved structure (the mismatches are listed), or the
                checkpoint asked for is corrupt.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> _ = store.save({"w": np.ones(2, np.float32)}, step=1)
            >>> tree, _ = store.restore(target={"w": np.zeros(2, np.float32)})
            >>> tree["w"].tolist()
            [1.0, 1.0]
        """
        if checkpoint is not None:
            return self._read(checkpoint, target), checkpoint
        for info in self.ranked():
            try:
                return self._read(info, target), info
            except CorruptCheckpointError as why:
                self.set_aside(info.path, why)
        raise FileNotFoundError(f"No valid checkpoint in {self.root}.")

    def _read(self, info: CheckpointInfo, target: Any) -> Any:
        if target is not None:
            check_structure(info.manifest["tree"], flat_leaves(target))
        try:
            with open(info.path / DATA, "rb") as f:
                leaves, crc = read_leaves(f)
        except Exception as e:  # truncated or garbled msgpack
            raise corrupt(info.path, DATA, f"cannot be read ({type(e).__name__}: {e})") from None
        if crc != info.manifest["files"][DATA].get("crc32"):
            raise corrupt(info.path, DATA, f"does not match the checksum in {MANIFEST}")
        nested = traverse_util.unflatten_dict(leaves, sep="/") if "" not in leaves else leaves[""]
        return nested if target is None else serialization.from_state_dict(target, nested)


def _newer(c: CheckpointInfo) -> tuple[int, float, str]:
    """The order of checkpoints in time: by step, then (two of one step: a resumed run saved it again) write time."""
    wall_time = c.manifest.get("wall_time")
    return c.step, wall_time if isinstance(wall_time, float) else 0.0, c.path.name


def check_retention(keep_latest: object, keep_best: object, keep_every: object, mode: object) -> None:
    """Raise unless the counts are positive ints (or None) and ``mode`` is "min" or "max"."""
    for label, value in (("keep_latest", keep_latest), ("keep_best", keep_best), ("keep_every", keep_every)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"`{label}` must be a positive int or None, got {value!r}.")
    if mode not in ("min", "max"):
        raise ValueError(f"`mode` must be 'min' or 'max', got {mode!r}.")
