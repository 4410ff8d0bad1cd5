"""`CheckpointStore`: save checkpoints atomically (in the foreground or on a writer thread) into one folder."""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ember.checkpoint._amend import Amending
from ember.checkpoint._amend import then_after as _then
from ember.checkpoint._atomic import abandoned, commit, temporary_dir
from ember.checkpoint._folder import DATA, CheckpointFolder
from ember.checkpoint._format import lower_thread_priority, write_leaves
from ember.checkpoint._info import CheckpointInfo
from ember.checkpoint._manifest import (
    CorruptCheckpointError,
    describe_tree,
    new_manifest,
    write_manifest,
)
from ember.checkpoint._notice import committed
from ember.checkpoint._snapshot import check_gatherable, detach, flat_leaves, on_host


class CheckpointStore(Amending, CheckpointFolder):
    """Checkpoints in one folder, each committed atomically and verified before it is ever returned.

    A checkpoint is a folder holding ``state.msgpack`` (the tree, streamed leaf by leaf) and
    ``manifest.json`` (step, metrics, wall time, ember version, each leaf's path, shape and dtype, and
    the size and CRC-32 of the data file). It is written under a temporary name in the same folder,
    fsynced, renamed into place, and the folder is fsynced: a crash leaves either a complete checkpoint or
    a temporary folder, which the next store opened on the folder removes. Files get the permissions the
    umask allows.

    In a multi-process run only process 0 writes and deletes (the others get the info back from ``save``
    and read the same folder, which must be on a shared file system to restore on every process).

    A checkpoint that is incomplete or corrupt (missing manifest, truncated data, bad checksum) is never returned:
    [`latest`][ember.checkpoint.CheckpointFolder.latest], [`best`][ember.checkpoint.CheckpointFolder.best] and
        [`restore`][ember.checkpoint.CheckpointFolder.restore] skip it with a warning that names it and
    says why, and fall back to the newest valid one.

    Background saves ([`save_in_background`][ember.checkpoint.CheckpointStore.save_in_background]) copy the state to the
    host before they return, so the training thread waits for that copy (on a GPU the queued steps finish first, then
    the copy runs). ``device_snapshot=True`` copies it on the device instead, which returns at once, and the writer
    thread fetches the copy while training goes on: training loses no time to the transfer, at the price of one more
    copy of the state in device memory while it lasts. On the CPU backend both are the same copy.

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
        self.root = Path(os.path.abspath(root))  # resolved once: a later chdir changes nothing
        self.root.mkdir(parents=True, exist_ok=True)
        for leftover in abandoned(self.root):  # an interrupted write; never one still in flight
            shutil.rmtree(leftover, ignore_errors=True)
        self._writer: ThreadPoolExecutor | None = None
        self._pending: Future[CheckpointInfo] | None = None
        self._host_buffers: list[np.ndarray] = []  # reused by background saves (see detach)
        self._verified = {}

    # -- writing ---------------------------------------------------------------------------------

    def save(
        self,
        tree: Any,
        *,
        step: int,
        metrics: Mapping[str, float] | None = None,
        metadata: Mapping[str, Any] | None = None,
        name: str | None = None,
        replaces: str | None = None,
    ) -> CheckpointInfo:
        """Write ``tree`` (a pytree of arrays and scalars) as a new checkpoint; return its info.

        Waits for a background save still in flight first (see
        [`save_in_background`][ember.checkpoint.CheckpointStore.save_in_background]).

        Args:
            tree: what to save; device arrays are copied to the host first.
            step: the training step it belongs to.
            metrics: numbers to rank checkpoints by (``best``).
            metadata: any JSON-serialisable extras (an engine's ``state_dict()``).
            name: the folder name; ``step_<step>`` by default.
            replaces: the name of a checkpoint this one supersedes (the same step, saved again after its state
                changed), deleted once this one is committed; it may be ``name`` itself. A crash leaves one of
                the two, or both, never neither.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> store.save({"w": np.zeros(2)}, step=3, name="step_3-loss=0.1").path.name
            'step_3-loss=0.1'
        """
        elsewhere = self._start_save(tree, step, metrics, name)
        if elsewhere is not None:
            return self._heard(elsewhere)
        return self._write(self._prepare(tree, step, metrics, metadata, name, replaces))

    def save_in_background(
        self,
        tree: Any,
        *,
        step: int,
        metrics: Mapping[str, float] | None = None,
        metadata: Mapping[str, Any] | None = None,
        name: str | None = None,
        then: Callable[[], object] | None = None,
        replaces: str | None = None,
    ) -> Future[CheckpointInfo]:
        """Copy ``tree`` now, then serialise and write it on a background thread.

        When this returns, training may change the device state freely: what is saved is already a copy of its own, on
        the host (or, with ``device_snapshot=True``, on the device, fetched by the writer). The write runs on one
        background thread; the next save (of either kind) first waits for it, and re-raises its error if it failed, as
        do [`wait`][ember.checkpoint.CheckpointStore.wait] and
        [`raise_if_failed`][ember.checkpoint.CheckpointStore.raise_if_failed]. ``then`` runs on the same thread once the
        checkpoint is committed (retention: [`prune`][ember.checkpoint.CheckpointFolder.prune]), so the training thread
        waits for neither.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> future = store.save_in_background({"w": np.ones(2)}, step=1, then=lambda: store.prune(keep_latest=1))
            >>> store.wait().step, future.result().path.name
            (1, 'step_00000001')
        """
        elsewhere = self._start_save(tree, step, metrics, name)
        if elsewhere is not None:  # process 0 writes; this process hears when it has, on its own writer thread
            self._pending = self._submit(_then, functools.partial(self._heard, elsewhere), then)
            return self._pending
        if not self.collective_saves:  # a collective store (orbax) takes its own copy, shard by shard
            tree = detach(tree, self._host_buffers, on_device=self.device_snapshot)
        prepared = self._prepare(tree, step, metrics, metadata, name, replaces)
        self._pending = self._submit(_then, functools.partial(self._write, prepared), then)
        return self._pending

    def _submit(self, *task: Any) -> Future[CheckpointInfo]:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="ember-checkpoint", initializer=lower_thread_priority
            )
        return self._writer.submit(*task)

    def _writes_manifests(self) -> bool:  # the folder's (Amending only declares it)
        return CheckpointFolder._writes_manifests(self)

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
        if jax.process_count() > 1:  # one process addresses every array
            check_gatherable(tree)  # on every process, so all of them fail alike
        if jax.process_index() == 0:
            return None
        return CheckpointInfo(
            self.root / (name or f"step_{step:08d}"),
            step,
            {k: float(v) for k, v in (metrics or {}).items()},
            {"step": step, "written_by": "process 0"},
        )

    def wait(self, timeout: float | None = None) -> CheckpointInfo | None:
        """Block until a background save is on disk; re-raise its error; return its info (or ``None``).

        With ``timeout`` (seconds), raise ``TimeoutError`` if it is not done by then; the save goes on, and a later
        ``wait`` waits for it again.

        Examples:
            >>> import tempfile
            >>> from ember.checkpoint import CheckpointStore
            >>> CheckpointStore(tempfile.mkdtemp()).wait() is None
            True
        """
        pending = self._pending
        if pending is None:
            return None
        try:
            info = pending.result(timeout)
        except TimeoutError:
            raise TimeoutError(
                f"The checkpoint being written into {self.root} was not done within {timeout} s."
            ) from None
        finally:
            if pending.done():
                self._pending = None
        return info

    def close(self) -> None:
        """Wait for a write in flight (raising its error) and stop the writer thread; a later save starts another.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> _ = store.save_in_background({"w": np.zeros(1)}, step=1)
            >>> store.close(); store.latest().step
            1
        """
        try:
            self.wait()
        finally:
            if self._writer is not None:
                self._writer.shutdown()
                self._writer = None

    def finish(self) -> CheckpointInfo | None:
        """Make every save so far as safe as this store makes any: here, wait for the write in flight.

        A [`Checkpoint`][ember.handlers.Checkpoint] calls it when its run completes; a
        [`TieredStore`][ember.checkpoint.TieredStore] copies its last save into the durable tier there.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> _ = store.save_in_background({"w": np.zeros(1)}, step=1)
            >>> store.finish().step
            1
        """
        return self.wait()

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
            # the ignore below: done() was true, so exception() is the raised error or None (checked above)
            raise pending.exception()  # type: ignore[misc]

    def _prepare(
        self,
        tree: Any,
        step: int,
        metrics: Mapping[str, float] | None,
        metadata: Mapping[str, Any] | None,
        name: str | None,
        replaces: str | None,
    ) -> Prepared:
        name = self._new_name(step, name, replaces)
        manifest = new_manifest(step, metrics, metadata)  # the tree is described by _write, off the training thread
        return Prepared(name, manifest, replaces, leaves=flat_leaves(tree))

    def _new_name(self, step: int, name: str | None, replaces: str | None = None) -> str:
        """Check ``step``, ``name`` and ``replaces``; return the folder name of a new checkpoint."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"`step` must be a non-negative int, got {step!r}.")
        name = name or f"step_{step:08d}"
        for label, value in (("name", name), ("replaces", replaces)):
            if value is not None and ("/" in value or value.startswith(".")):
                raise ValueError(f"`{label}` must be a plain folder name, got {value!r}.")
        if (self.root / name).exists() and name != replaces:
            try:
                self.verify(self.root / name)
            except CorruptCheckpointError as why:  # a damaged checkpoint of this step: out of the way
                self.set_aside(self.root / name, why)
                return name
            except ValueError:
                pass
            raise FileExistsError(f"A checkpoint named {name!r} already exists in {self.root}.")
        return name

    def _heard(self, info: CheckpointInfo) -> CheckpointInfo:
        """On a process that does not write: return once process 0 has committed the save, or raise its error."""
        problem = committed(self.root, None)
        if problem is not None:
            raise problem
        return info

    def _write(self, prepared: Prepared) -> CheckpointInfo:
        try:
            info = self._write_files(prepared)
        except BaseException as e:
            if jax.process_count() > 1:
                committed(self.root, e)  # the others raise it too
            raise
        if jax.process_count() > 1:
            committed(self.root, None)
        return info

    def _write_files(self, prepared: Prepared) -> CheckpointInfo:
        leaves = on_host(prepared.leaves)  # device snapshots (or, saving in the foreground, the state) come over here
        manifest = prepared.manifest
        manifest["tree"] = describe_tree(leaves)
        tmp = temporary_dir(self.root, prepared.name)
        try:
            with open(tmp / DATA, "wb") as f:
                size, crc = write_leaves(f, list(leaves.items()))
                f.flush()
                os.fsync(f.fileno())
            manifest["files"] = {DATA: {"bytes": size, "crc32": crc}}
            write_manifest(tmp, manifest)
            self._commit(tmp, prepared)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise naming(e, prepared.name, self.root) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return CheckpointInfo(self.root / prepared.name, manifest["step"], manifest["metrics"], manifest)

    def _commit(self, tmp: Path, prepared: Prepared) -> None:
        replaces = self.root / prepared.replaces if prepared.replaces is not None else None
        commit(tmp, self.root / prepared.name, replaces=replaces)


def naming(error: OSError, name: str, root: Path) -> OSError:
    """``error``, of its own type and errno, saying which checkpoint could not be written.

    Both stores say it alike: ``[Errno 28] No space left on device (could not write checkpoint 'step_00000004' in
    /runs/x)``.
    """
    if error.errno is None:
        return error
    return type(error)(error.errno, f"{error.strerror} (could not write checkpoint {name!r} in {root})")


@dataclass
class Prepared:
    """A save checked and started in the caller's thread, which ``_write`` finishes (maybe on the writer thread).

    ``leaves`` is the tree to write (this store's); a collective store's save has written its arrays into ``tmp``
    already.
    """

    name: str
    manifest: dict[str, Any]
    replaces: str | None
    leaves: dict[str, Any] = field(default_factory=dict[str, Any])
    tmp: Path | None = None
