"""`CheckpointFolder`: list, verify, rank, restore and prune the checkpoints in one folder (a store's read side).

Also the order of checkpoints (`newer`, `preferred`) and retention's checks (`check_retention`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import jax

from ember._atomic_file import TMP_PREFIX
from ember.checkpoint._atomic import remove
from ember.checkpoint._contract import Format
from ember.checkpoint._format import checksum_problem, size_problem
from ember.checkpoint._manifest import (
    CheckpointInfo,
    CorruptCheckpointError,
    WrongStoreError,
    corrupt,
    file_records,
    read_manifest,
)
from ember.checkpoint._msgpack import MsgpackFormat

CORRUPT_PREFIX = "corrupt-"  # a checkpoint that failed verification, moved aside (never deleted)


class CheckpointFolder:
    """The checkpoints in one folder, as a store reads them; ``CheckpointStore`` adds writing.

    Every checkpoint it returns has been verified (manifest checksum, data size and CRC-32); a damaged one
    is moved aside as ``corrupt-<name>``, with a warning, and the next valid one is used. Its format (msgpack by
    default) recognises its own checkpoints and reads their arrays; the rest is the folder's, for every format.

    Args:
        root: the folder (a relative path is taken from the working folder now).
        format: how the checkpoints hold their arrays; msgpack by default.

    Examples:
        >>> import tempfile, numpy as np
        >>> from ember.checkpoint import CheckpointStore
        >>> store = CheckpointStore(tempfile.mkdtemp())
        >>> _ = store.save({"w": np.zeros(1)}, step=5)
        >>> [c.step for c in store.checkpoints()], store.latest().step
        ([5], 5)
    """

    def __init__(self, root: str | os.PathLike[str], format: Format | None = None) -> None:
        self.root = Path(os.path.abspath(root))  # resolved once: a later chdir changes nothing
        self.format: Format = format if format is not None else MsgpackFormat()
        self._verified: dict[tuple[Any, ...], CheckpointInfo] = {}  # by `_written`, for checkpoints()

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
        if keep_latest is None and keep_best is None and keep_every is None:
            return []  # no policy: keep everything
        doomed: list[CheckpointInfo] = []
        for folder in self._pruned():  # a tiered store: each tier on its own
            if not folder._writes_manifests():
                continue  # only the process that writes deletes
            mine = [c for c in folder.checkpoints() if c.path.name.startswith(prefix)]
            kept: set[Path] = set()
            if keep_latest:  # the newest steps: two checkpoints of one step count once
                newest = sorted({c.step for c in mine})[-keep_latest:]
                kept |= {c.path for c in mine if c.step in newest}
            if keep_best and metric is not None:
                sign = 1.0 if mode == "max" else -1.0
                scored = sorted(
                    (c for c in mine if metric in c.metrics), key=lambda c: (sign * c.metrics[metric], c.step)
                )
                kept |= {c.path for c in scored[-keep_best:]}
            if keep_every:
                kept |= {c.path for c in mine if c.step % keep_every == 0}
            for c in mine:
                if c.path not in kept:
                    folder.delete(c)
                    doomed.append(c)
        return doomed

    def _pruned(self) -> tuple[CheckpointFolder, ...]:
        """The folders `prune` applies its policies to, each on its own: this one (a tiered store: its tiers)."""
        return (self,)

    def delete(self, checkpoint: CheckpointInfo | str) -> None:
        """Remove a checkpoint, given by its info or its folder's name; one already gone is no error.

        The folder is renamed to a temporary name first, so a crash never leaves half of one.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> _ = store.save({"w": np.zeros(1)}, step=1); _ = store.save({"w": np.zeros(1)}, step=2)
            >>> store.delete("step_00000001"); [c.step for c in store.checkpoints()]
            [2]
        """
        if isinstance(checkpoint, CheckpointInfo):
            remove(checkpoint.path)
            return
        if not checkpoint or "/" in checkpoint or checkpoint in (".", ".."):
            raise ValueError(f"`checkpoint` must be a checkpoint's folder name in {self.root}, got {checkpoint!r}.")
        remove(self.root / checkpoint)

    # -- finding ---------------------------------------------------------------------------------

    def _writes_manifests(self) -> bool:
        """Whether this process writes, renames and deletes in this folder (process 0, or each in its own folder)."""
        return self.format.writers == "own" or jax.process_index() == 0

    def find(self, name: str) -> CheckpointInfo | None:
        """The valid checkpoint named ``name``, or ``None`` (there is none, or it is damaged).

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> _ = store.save({"w": np.zeros(1)}, step=7)
            >>> store.find("step_00000007").step, store.find("step_00000008")
            (7, None)
        """
        path = self.root / name
        if not path.is_dir():
            return None
        try:
            return self.verify(path)
        except ValueError:  # CorruptCheckpointError too: a save of that name moves it aside
            return None

    def path_of(self, name: str) -> Path:
        """The folder checkpoint ``name`` is (or, while it is written, will be) in.

        Examples:
            >>> import tempfile
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> store.path_of("step_00000003") == store.root / "step_00000003"
            True
        """
        return self.root / name

    def holds(self, info: CheckpointInfo) -> bool:
        """Whether ``info`` is a checkpoint in this store's folder (rather than one read from elsewhere).

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> store.holds(store.save({"w": np.zeros(1)}, step=1))
            True
        """
        return info.path.parent == self.root

    def _candidates(self) -> list[Path]:
        return sorted(
            p
            for p in self.root.iterdir()
            if p.is_dir() and not p.name.startswith(".") and not p.name.startswith(CORRUPT_PREFIX)
        )

    def verify(self, path: str | os.PathLike[str], *, full: bool = False) -> CheckpointInfo:
        """The info of the checkpoint in folder ``path``, once its manifest and its files check out.

        Every file the manifest records must be there with its recorded size (one ``stat`` per file). With ``full``,
        every byte is read too and checked against its CRC-32, as a restore does (``ember inspect`` does it).

        Raises:
            CorruptCheckpointError: the checkpoint is damaged (the message names the folder and the file).
            ValueError: the folder holds no checkpoint of this store's kind.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> info = store.save({"w": np.zeros(1)}, step=4)
            >>> store.verify(info.path).step, store.verify(info.path, full=True).step
            (4, 4)
        """
        path = Path(path)
        try:
            manifest = read_manifest(path)
        except FileNotFoundError:
            raise ValueError("it has no manifest (it is not a checkpoint, or its write did not finish)") from None
        self.format.check_kind(path, manifest)
        problem = (checksum_problem if full else size_problem)(path, file_records(manifest))
        if problem is not None:
            raise corrupt(path, *problem)
        return CheckpointInfo(path, manifest["step"], dict(manifest["metrics"]), manifest)

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
        if self._writes_manifests() and path.exists():
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
        known, self._verified = self._verified, {}
        for path in self._candidates():
            try:
                key = _written(path)  # a checkpoint is verified again only when one of its files was rewritten
                self._verified[key] = known[key] if key in known else self.verify(path)
            except (ValueError, FileNotFoundError):  # damaged, or deleted since it was listed
                continue
        return sorted(self._verified.values(), key=newer)

    def ranked(self, metric: str | None = None, mode: Literal["min", "max"] = "max") -> list[CheckpointInfo]:
        """Valid checkpoints, preferred first: newest step first, or best by ``metric`` first (``mode``).

        Damaged ones are moved aside with a warning ([`set_aside`][ember.checkpoint.CheckpointFolder.set_aside]); with
        ``metric``, checkpoints without it are left out. Ties go to the later step.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import CheckpointStore
            >>> store = CheckpointStore(tempfile.mkdtemp())
            >>> for step, acc in ((1, 0.7), (2, 0.9), (3, 0.8)):
            ...     _ = store.save({"w": np.zeros(1)}, step=step, metrics={"acc": acc})
            >>> [c.step for c in store.ranked()], [c.step for c in store.ranked("acc")]
            ([3, 2, 1], [2, 3, 1])
        """
        check_mode(mode)
        found = []
        for path in self._candidates():
            try:
                found.append(self.verify(path))
            except CorruptCheckpointError as why:
                self.set_aside(path, why)
            except WrongStoreError as why:  # the wrong store for this folder: refused, so no run starts anew over it
                raise ValueError(f"Checkpoint {str(path)!r} cannot be restored: {why}.") from None
            except ValueError as why:
                warnings.warn(f"Skipping checkpoint {path.name!r}: {why}.", UserWarning, stacklevel=3)
        return preferred(found, metric, mode)

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

    def restore(
        self,
        target: Any = None,
        checkpoint: CheckpointInfo | None = None,
        *,
        on_verified: Callable[[], object] | None = None,
    ) -> tuple[Any, CheckpointInfo]:
        """Read a checkpoint (the latest valid one by default), verified against its checksums.

        With ``target``, the tree is restored into its structure (``flax.serialization``), after checking that
        every path, shape and dtype matches; ``target``'s leaves may be arrays or ``jax.ShapeDtypeStruct`` (an
        abstract target, which holds no memory). Otherwise a nested dict of NumPy arrays comes back. When the latest
        checkpoint turns out damaged, it is moved aside with a warning and the next newest one is read.

        ``on_verified`` is called once the checkpoint has passed every check and before any restored array is
        created: a caller releases there the memory that the restored state replaces (a trainer's live state), so
        that the two never exist at once. Only damage found in the checkpoint's own files moves it aside; any other
        error is raised as it is, and the checkpoint stays where it was.

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
            return self._read(checkpoint, target, on_verified), checkpoint
        for info in self.ranked():  # the first that reads back whole; each found damaged on the way set aside
            try:
                return self._read(info, target, on_verified), info
            except CorruptCheckpointError as why:
                self.set_aside(info.path, why)
        raise FileNotFoundError(f"No valid checkpoint in {self._where()}.")

    def _read(self, info: CheckpointInfo, target: Any, on_verified: Callable[[], object] | None) -> Any:
        return self.format.read(info, target, on_verified)

    def _where(self) -> str:
        """Where this store's checkpoints are, as a message names it."""
        return str(self.root)


def _written(path: Path) -> tuple[Any, ...]:
    """The folder's name with the modification time and size of each of its files.

    A temporary file (a manifest being replaced, by this process or another) is not one of them, and may be gone
    before it is looked at.
    """
    found = []
    for p in path.iterdir():
        if p.name.startswith(TMP_PREFIX):
            continue
        try:
            st = p.stat()
        except FileNotFoundError:  # replaced while we looked: the folder changed, and the new file counts next time
            continue
        found.append((p.name, st.st_mtime_ns, st.st_size))
    return (path.name, *sorted(found))


def newer(c: CheckpointInfo) -> tuple[int, float, str]:
    """The order of checkpoints in time: by step, then (two of one step: a resumed run saved it again) write time."""
    wall_time = c.manifest.get("wall_time")
    return c.step, wall_time if isinstance(wall_time, float) else 0.0, c.path.name


def preferred(found: list[CheckpointInfo], metric: str | None, mode: Literal["min", "max"]) -> list[CheckpointInfo]:
    """``found`` newest first, or (with ``metric``) those that carry it, best first; ties go to the later step."""
    newest_first = sorted(found, key=newer, reverse=True)
    if metric is None:
        return newest_first
    sign = 1.0 if mode == "max" else -1.0
    scored = [c for c in newest_first if metric in c.metrics]
    return sorted(scored, key=lambda c: (sign * c.metrics[metric], c.step), reverse=True)


def check_mode(mode: object) -> None:
    """Raise unless ``mode`` is "min" or "max"."""
    if mode not in ("min", "max"):
        raise ValueError(f"`mode` must be 'min' or 'max', got {mode!r}.")


def check_retention(keep_latest: object, keep_best: object, keep_every: object, mode: object) -> None:
    """Raise unless the counts are positive ints (or None) and ``mode`` is "min" or "max".

    [`CheckpointFolder.prune`][ember.checkpoint.CheckpointFolder.prune] checks its policies so; a handler that prunes
    later checks them when it is built, so a bad value fails before training starts.

    Examples:
        >>> from ember.checkpoint import check_retention
        >>> check_retention(keep_latest=0, keep_best=None, keep_every=None, mode="max")
        Traceback (most recent call last):
        ...
        ValueError: `keep_latest` must be a positive int or None, got 0.
    """
    for label, value in (("keep_latest", keep_latest), ("keep_best", keep_best), ("keep_every", keep_every)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"`{label}` must be a positive int or None, got {value!r}.")
    check_mode(mode)
