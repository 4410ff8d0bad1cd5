"""Rewriting a checkpoint's manifest (its metrics, its metadata) without writing its arrays again."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ember._atomic_file import replace_file
from ember.checkpoint._info import CheckpointInfo
from ember.checkpoint._manifest import MANIFEST, amended, manifest_text, new_manifest, read_manifest


class Amending:
    """What a [`CheckpointStore`][ember.checkpoint.CheckpointStore] adds to amend a checkpoint it wrote.

    For a save of a step whose arrays have not changed since that step was saved: only the manifest is written
    again, atomically (a temporary file, fsynced, renamed over it), in order with the store's other writes.
    """

    root: Path
    _pending: Future[CheckpointInfo] | None

    def wait(self, timeout: float | None = None) -> CheckpointInfo | None:  # the store's
        raise NotImplementedError

    def _submit(self, *task: Any) -> Future[CheckpointInfo]:  # the store's
        raise NotImplementedError

    def _writes_manifests(self) -> bool:  # the store's
        raise NotImplementedError

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
        new_manifest(0, metrics, metadata)  # JSON, or a TypeError here
        previous = self._pending
        self.wait()
        return self._amend(previous, name, metrics, metadata)

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
        amend = functools.partial(self._amend, self._pending, name, metrics, metadata)
        self._pending = self._submit(then_after, amend, then)
        return self._pending

    def _amend(
        self,
        previous: Future[CheckpointInfo] | None,
        name: str,
        metrics: Mapping[str, float] | None,
        metadata: Mapping[str, Any] | None,
    ) -> CheckpointInfo:
        saved = previous.result() if previous is not None else None  # on disk (or its error is this one's)
        path = self.root / name
        if not self._writes_manifests():  # process 0 amends; the info says what it writes
            step = saved.step if saved is not None else -1
            manifest = {"step": step, "written_by": "process 0"}
            return CheckpointInfo(path, step, dict(metrics or {}), manifest)
        manifest = amended(read_manifest(path), metrics, metadata)
        replace_file(path, MANIFEST, manifest_text(manifest))
        return CheckpointInfo(path, manifest["step"], manifest["metrics"], manifest)


def then_after(task: Callable[[], CheckpointInfo], then: Callable[[], object] | None) -> CheckpointInfo:
    """``task()``, then ``then()``: one background task, so a failure of either is the task's."""
    info = task()
    if then is not None:
        then()
    return info
