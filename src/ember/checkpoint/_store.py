"""`Store`, the writing every store of ember's has; `CheckpointStore`, which writes into one folder atomically.

Also `WriterThread`, a store's one background thread.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax

from ember._atomic_file import abandoned
from ember.checkpoint._atomic import commit
from ember.checkpoint._contract import Draft, Format
from ember.checkpoint._folder import CheckpointFolder
from ember.checkpoint._format import check_gatherable, lower_thread_priority
from ember.checkpoint._manifest import (
    CheckpointInfo,
    CorruptCheckpointError,
    amend_manifest,
    new_manifest,
    write_manifest,
)
from ember.checkpoint._msgpack import MsgpackFormat
from ember.checkpoint._notice import committed, gathered

#: a save's or an amendment's metrics, metadata, and what runs once it is on disk (the writer threads' arguments)
Metrics = Mapping[str, float] | None
Metadata = Mapping[str, Any] | None
Then = Callable[[], object] | None


class Store(CheckpointFolder):
    """What every store of ember's writes with: save (in the background or not), amend, wait, finish and close.

    A [`CheckpointStore`][ember.checkpoint.CheckpointStore] writes into one folder on one writer thread; a
    [`TieredStore`][ember.checkpoint.TieredStore] through two such stores, its tiers. Each says how a save begins
    (``_submit``) and an amendment (``_submit_amend``), and which stores it writes through (``_parts``: itself, or
    its tiers, fast first); the rest is this class's, the same for both. A foreground save is the background save
    (without the copy) followed by a wait.

    Examples:
        >>> import tempfile, numpy as np
        >>> from ember.checkpoint import CheckpointStore, TieredStore
        >>> from ember.checkpoint._store import Store
        >>> isinstance(CheckpointStore(tempfile.mkdtemp()), Store), isinstance(TieredStore(tempfile.mkdtemp(),
        ...     tempfile.mkdtemp()), Store)
        (True, True)
    """

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

        The background save (see [`save_in_background`][ember.checkpoint.CheckpointStore.save_in_background]) and a
        wait for it: the tree is not copied first, as the caller waits until it is on disk.

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
        self._submit(Save(tree, step, metrics, metadata, name, replaces), background=False)
        return self._waited()

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
        removes: Sequence[str] = (),
    ) -> Future[CheckpointInfo]:
        """Copy ``tree`` now, then serialise and write it on a background thread.

        When this returns, training may change the device state freely: what is saved is already a copy of its own, on
        the host (or, with ``device_snapshot=True``, on the device, fetched by the writer). The write runs on one
        background thread; the next save (of either kind) first waits for it, and re-raises its error if it failed, as
        do [`wait`][ember.checkpoint.CheckpointStore.wait] and
        [`raise_if_failed`][ember.checkpoint.CheckpointStore.raise_if_failed]. ``then`` runs on the same thread once the
        checkpoint is committed (retention: [`prune`][ember.checkpoint.CheckpointFolder.prune]), so the training thread
        waits for neither; the checkpoints named in ``removes`` (those retention no longer keeps) are deleted there
        first, once this one is committed.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> future = store.save_in_background({"w": np.ones(2)}, step=1, then=lambda: store.prune(keep_latest=1))
            >>> store.wait().step, future.result().path.name
            (1, 'step_00000001')
        """
        return self._submit(Save(tree, step, metrics, metadata, name, replaces, list(removes), then), background=True)

    def amend(
        self, name: str, *, metrics: Mapping[str, float] | None = None, metadata: Mapping[str, Any] | None = None
    ) -> CheckpointInfo:
        """Replace the metrics or the metadata of checkpoint ``name`` (those given); its arrays stay as they are.

        For a save of a step whose arrays have not changed since it was saved (the same state, saved again at the
        epoch's end with ``epoch_completed`` now true): only the manifest is written again, atomically, and no
        second copy of the arrays is made. Waits for a background save in flight first.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> _ = store.save({"w": np.ones(2)}, step=3, metadata={"epoch_completed": False})
            >>> info = store.amend("step_00000003", metadata={"epoch_completed": True})
            >>> info.manifest["metadata"], [c.path.name for c in store.checkpoints()]
            ({'epoch_completed': True}, ['step_00000003'])
        """
        self.amend_in_background(name, metrics=metrics, metadata=metadata)
        return self._waited()

    def amend_in_background(
        self,
        name: str,
        *,
        metrics: Mapping[str, float] | None = None,
        metadata: Mapping[str, Any] | None = None,
        then: Callable[[], object] | None = None,
    ) -> Future[CheckpointInfo]:
        """[`amend`][ember.checkpoint.CheckpointStore.amend] on the writer thread, after the save in flight.

        The training thread waits for nothing: a save of ``name`` still being written is amended once it is on disk
        (and if it fails, this fails with its error). ``then`` runs after, as for a background save.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> _ = store.save_in_background({"w": np.ones(2)}, step=3)
            >>> _ = store.amend_in_background("step_00000003", metrics={"loss": 0.5})
            >>> store.wait().metrics
            {'loss': 0.5}
        """
        new_manifest(0, metrics, metadata)  # JSON, or a TypeError here, in the caller's thread
        return self._submit_amend(name, metrics, metadata, then)

    def wait(self, timeout: float | None = None) -> CheckpointInfo | None:
        """Block until a background save is on disk; re-raise its error; return its info (or ``None``).

        With ``timeout`` (seconds), raise ``TimeoutError`` if it is not done by then; the save goes on, and a later
        ``wait`` waits for it again. A tiered store waits for both tiers (the timeout is for both together) and
        returns the last save's info.

        Examples:
            >>> import tempfile
            >>> from ember.checkpoint import CheckpointStore
            >>> CheckpointStore(tempfile.mkdtemp()).wait() is None
            True
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        info, problem = None, None
        for part in self._parts():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                got = part._writer.wait(left)
                info = got if got is not None else info
            except TimeoutError:  # this store's own folder named
                raise TimeoutError(
                    f"The checkpoint being written into {self.root} was not done within {timeout} s."
                ) from None
            except BaseException as e:  # the other tiers are still waited for; the first error is raised
                problem = problem or e
        if problem is not None:
            raise problem
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
        with contextlib.ExitStack() as stack:
            for part in reversed(self._parts()):  # each stopped, whatever failed before it; the wait first
                stack.callback(part.format.close)
                stack.callback(part._writer.close)
            self.wait()

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
        return any(part._writer.pending is not None for part in self._parts())

    @property
    def busy(self) -> bool:
        """Whether a write is in progress now: started and not finished (`writing` also counts a finished one).

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> _ = store.save_in_background({"w": np.zeros(1)}, step=1); _ = store.wait()
            >>> store.busy, store.writing
            (False, False)
        """
        return any(part._writer.busy for part in self._parts())

    def raise_if_failed(self) -> None:
        """Re-raise the error of a background save that has already failed; never blocks.

        Examples:
            >>> import tempfile
            >>> from ember.checkpoint import CheckpointStore
            >>> CheckpointStore(tempfile.mkdtemp()).raise_if_failed()
        """
        failed = None
        for part in self._parts():  # every tier's failed write is taken; the first error is raised
            try:
                part._writer.raise_if_failed()
            except BaseException as e:
                failed = failed or e
        if failed is not None:
            raise failed

    def _waited(self) -> CheckpointInfo:
        info = self.wait()
        assert info is not None  # the save or amendment just submitted
        return info

    def _parts(self) -> tuple[CheckpointStore, ...]:
        """The single-folder stores this one writes through: itself, or its tiers (fast first)."""
        raise NotImplementedError

    def _submit(self, save: Save, *, background: bool) -> Future[CheckpointInfo]:
        """Begin ``save`` on the caller's thread (a background one copies the tree); the rest on writer threads."""
        raise NotImplementedError

    def _submit_amend(self, name: str, metrics: Metrics, metadata: Metadata, then: Then) -> Future[CheckpointInfo]:
        """Begin amending checkpoint ``name`` once the save in flight is on disk; ``then`` after it."""
        raise NotImplementedError


@dataclass
class Save:
    """One save asked of a store: the tree, its step, metrics, metadata, name, and what it replaces and removes."""

    tree: Any
    step: int
    metrics: Metrics
    metadata: Metadata
    name: str | None
    replaces: str | None
    removes: list[str] = field(default_factory=list[str])
    then: Then = None


class CheckpointStore(Store):
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

    The store holds a format, which writes and reads the data files (msgpack here; orbax-checkpoint in an
    [`OrbaxStore`][ember.checkpoint.OrbaxStore]); the store itself names, commits, verifies, lists, prunes, amends,
    writes in the background and agrees across processes, the same for every format.

    Args:
        root: the folder; created if missing.
        device_snapshot: snapshot accelerator arrays on the device rather than on the host (see above).
        format: how the arrays are written and read: ember's stores pass theirs (``OrbaxStore``, a ``TieredStore``'s
            fast tier); msgpack, by default. The contract is in ``src/ember/checkpoint/README.md``.

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

    def __init__(
        self, root: str | os.PathLike[str], *, device_snapshot: bool = False, format: Format | None = None
    ) -> None:
        if not isinstance(device_snapshot, bool):
            raise TypeError(f"`device_snapshot` must be True or False, got {device_snapshot!r}.")
        super().__init__(root, format if format is not None else MsgpackFormat(device_snapshot=device_snapshot))
        self.device_snapshot = device_snapshot
        self.root.mkdir(parents=True, exist_ok=True)
        for leftover in abandoned(self.root):  # an interrupted write; never one still in flight
            shutil.rmtree(leftover, ignore_errors=True)
        self._writer = WriterThread(self.root)

    def _parts(self) -> tuple[CheckpointStore, ...]:
        return (self,)

    def _submit(self, save: Save, *, background: bool) -> Future[CheckpointInfo]:
        """Begin a save on the caller's thread; write it, delete ``removes`` and run ``then`` on the writer thread."""
        elsewhere = self._start_save(save)
        if elsewhere is not None:  # process 0 writes; this process hears when it has, on its own writer thread
            task = functools.partial(self._heard, elsewhere)
        else:
            task = functools.partial(self._write, self._draft(save, background))
        return self._writer.submit(task, functools.partial(self._after, save.removes, save.then))

    def _after(self, removes: list[str], then: Callable[[], object] | None) -> None:
        """On the writer thread, once a save is committed: delete what it supersedes (where this process deletes)."""
        for old in removes if self._writes_manifests() else ():
            self.delete(old)
        if then is not None:
            then()

    def _submit_amend(self, name: str, metrics: Metrics, metadata: Metadata, then: Then) -> Future[CheckpointInfo]:
        amend = functools.partial(self._amend, self._writer.pending, name, metrics, metadata)
        return self._writer.submit(amend, then)

    def _amend(
        self, previous: Future[CheckpointInfo] | None, name: str, metrics: Metrics, metadata: Metadata
    ) -> CheckpointInfo:
        saved = previous.result() if previous is not None else None  # on disk (or its error is this one's)
        if not self._writes_manifests():  # process 0 amends; the info says what it writes
            step = saved.step if saved is not None else -1
            return CheckpointInfo(
                self.root / name, step, dict(metrics or {}), {"step": step, "written_by": "process 0"}
            )
        return amend_manifest(self.root / name, metrics, metadata)

    def _start_save(self, save: Save) -> CheckpointInfo | None:
        """Wait for the previous save and check the tree; return ``None`` where this process writes.

        On a process other than 0 (which writes nothing) it returns the info the save would have.
        """
        self.wait()
        if self.format.writers != "primary":  # every process writes its share, or its own folder
            return None
        if jax.process_count() > 1:  # one process addresses every array
            check_gatherable(save.tree)  # on every process, so all of them fail alike
        if jax.process_index() == 0:
            return None
        return CheckpointInfo(
            self.root / (save.name or f"step_{save.step:08d}"),
            save.step,
            {k: float(v) for k, v in (save.metrics or {}).items()},
            {"step": save.step, "written_by": "process 0"},
        )

    def _draft(self, save: Save, background: bool) -> Draft:
        """Check the save and begin it (the format takes its copy); the tree is described off the training thread."""
        name = self._new_name(save.step, save.name, save.replaces)
        draft = Draft(name, new_manifest(save.step, save.metrics, save.metadata), save.replaces)
        try:
            self.format.prepare(draft, save.tree, self.root, background=background)
        except OSError as e:
            raise naming(e, draft.name, self.root) from None
        return draft

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

    def _write(self, draft: Draft) -> CheckpointInfo:
        """Write the data files (the format), gather every process's records if all wrote, commit, tell the others.

        Every process that takes part returns once the checkpoint is on disk, or raises the same error.
        """
        writers = self.format.writers
        commits = writers == "own" or jax.process_index() == 0
        problem: BaseException | None = None
        files: dict[str, Any] = {}
        try:
            files = self.format.write(draft, self.root)
        except BaseException as e:
            problem = naming(e, draft.name, self.root)
        if writers == "every":  # every process wrote its share: process 0 gets their records (or the first error)
            files, problem = gathered(self.root, files, problem)
        if problem is None and commits:
            try:
                assert draft.tmp is not None  # made by the format
                draft.manifest["files"] = files
                write_manifest(draft.tmp, draft.manifest)
                replaces = self.root / draft.replaces if draft.replaces is not None else None
                commit(draft.tmp, self.root / draft.name, replaces=replaces)
            except BaseException as e:
                problem = naming(e, draft.name, self.root)
        if problem is not None:
            self.format.abandon(draft)
            if commits and draft.tmp is not None:
                shutil.rmtree(draft.tmp, ignore_errors=True)
        if writers != "own" and jax.process_count() > 1:
            problem = committed(self.root, problem)  # process 0's word, on every process
        if problem is not None:
            raise problem
        manifest = draft.manifest
        return CheckpointInfo(self.root / draft.name, manifest["step"], manifest["metrics"], manifest)


def naming(error: BaseException, name: str, root: os.PathLike[str] | str) -> BaseException:
    """``error``, if an ``OSError``, of its own type and errno, saying which checkpoint could not be written.

    Every format says it alike: ``[Errno 28] No space left on device (could not write checkpoint 'step_00000004' in
    /runs/x)``. Other errors, and one named already, are returned as they are.
    """
    if not isinstance(error, OSError) or error.errno is None or "(could not write checkpoint" in str(error):
        return error
    return type(error)(error.errno, f"{error.strerror} (could not write checkpoint {name!r} in {root})")


class WriterThread:
    """One thread (started at the first task, at a lower priority than training) and the newest task's future.

    ``pending`` is the newest task not yet waited for: [`wait`][ember.checkpoint.CheckpointStore.wait] takes it (and
    raises its error), as does the next save.
    """

    def __init__(self, root: Path) -> None:
        self.root = root  # named in a timeout's message
        self._pool: ThreadPoolExecutor | None = None
        self.pending: Future[CheckpointInfo] | None = None
        _LIVE.add(self)

    def submit(self, task: Callable[[], CheckpointInfo], then: Callable[[], object] | None) -> Future[CheckpointInfo]:
        """Run ``task()`` then ``then()`` on the thread, after every task before it; it becomes ``pending``."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="ember-checkpoint", initializer=lower_thread_priority
            )
        self.pending = self._pool.submit(then_after, task, then)
        return self.pending

    @property
    def busy(self) -> bool:
        """Whether a task is running or queued now (the pending one has not finished)."""
        pending = self.pending
        return pending is not None and not pending.done()

    def wait(self, timeout: float | None = None) -> CheckpointInfo | None:
        """The pending task's info once it is done (``None`` if there is none); its error re-raised."""
        pending = self.pending
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
                self.pending = None
        return info

    def raise_if_failed(self) -> None:
        """Re-raise the error of a pending task that has already failed; never blocks."""
        pending = self.pending
        if pending is not None and pending.done() and pending.exception() is not None:
            self.pending = None
            # the ignore below: done() was true, so exception() is the raised error or None (checked above)
            raise pending.exception()  # type: ignore[misc]

    def close(self) -> None:
        """Wait for the pending task (raising its error), and stop the thread; a later task starts another."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None


_LIVE: weakref.WeakSet[WriterThread] = weakref.WeakSet()  # every writer of this process, for `settle_writes_into`


def settle_writes_into(path: Path) -> None:
    """Wait until no write of this process is in flight into ``path`` or into its parent folder (its checkpoint).

    The writes' errors stay with their stores (their owners raise them); a reader only waits for the files.
    """
    here = path.resolve()
    for writer in list(_LIVE):
        pending = writer.pending
        if pending is not None and writer.root.resolve() in (here, here.parent):
            wait_for([pending])


def then_after(task: Callable[[], CheckpointInfo], then: Callable[[], object] | None) -> CheckpointInfo:
    """``task()``, then ``then()``: one background task, so a failure of either is the task's."""
    info = task()
    if then is not None:
        then()
    return info
