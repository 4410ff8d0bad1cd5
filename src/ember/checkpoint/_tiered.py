"""`TieredStore`: every save into a fast tier (each process's own folder), every k-th and the last into a durable."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jax
import numpy as np

from ember.checkpoint._fast_owner import owned_fast_root
from ember.checkpoint._info import CheckpointInfo
from ember.checkpoint._orbax import open_store
from ember.checkpoint._order import newer
from ember.checkpoint._shards import NotHere, ShardStore
from ember.checkpoint._store import CheckpointStore
from ember.checkpoint._tiered_read import TieredReading


class TieredStore(TieredReading, CheckpointStore):
    """Checkpoints in two tiers: every save into a fast folder, every ``durable_every``-th and the last into a durable.

    The fast tier is a folder on local, quick storage (``/dev/shm/run``, a node's NVMe) that a relaunch on the same
    machine finds again; each process writes its own shards there, into ``process-<i>-of-<n>``, without waiting for
    the others, and keeps its newest ``keep_fast``. The folder belongs to one run: ``tier-of.json`` names its
    durable tier, and a store with another durable tier given the same folder warns, reads none of its checkpoints
    and keeps its own in a subfolder (``of-<durable folder>-<hash>``) that its relaunches find again. The durable
    tier is an ordinary store (a folder, or a [`CheckpointStore`][ember.checkpoint.CheckpointStore] or
    [`OrbaxStore`][ember.checkpoint.OrbaxStore]) on storage that outlives the machine. Both commit atomically and
    verify every file. A save also goes into the durable tier when it replaces a checkpoint that tier holds; the
    last save of a run goes there when the run completes ([`finish`][ember.checkpoint.TieredStore.finish], which a
    [`Checkpoint`][ember.handlers.Checkpoint] calls at COMPLETED), read back from the fast tier.

    A restore takes the newest checkpoint, of either tier, that reads back whole. A fast tier that is gone (a node
    replaced, ``/dev/shm`` wiped) or damaged falls back to the durable tier, as does a fast checkpoint saved with
    another number of processes or another layout. With several processes a fast checkpoint is used only if every
    process has its own part of it intact: they agree on it (every process restores together, as it does from any
    store), and otherwise all read the durable tier.

    Retention: a [`Checkpoint`][ember.handlers.Checkpoint]'s ``n_saved`` applies to the checkpoints as one sequence,
    in both tiers, except that the durable tier's newest checkpoint is kept until the durable tier has a newer one
    (the fast tier's later saves never leave the durable tier empty).

    Args:
        fast: the fast tier's folder (each process uses its own folder inside it).
        durable: the durable tier: a folder (opened with [`open_store`][ember.checkpoint.open_store]) or a store.
        durable_every: every this many saves, one goes into the durable tier too (counted on across relaunches: a
            run relaunched more often than this still reaches the durable tier).
        keep_fast: how many of its newest checkpoints each process's fast tier keeps.

    Examples:
        >>> import tempfile, numpy as np
        >>> from ember.checkpoint import TieredStore
        >>> store = TieredStore(fast=tempfile.mkdtemp(), durable=tempfile.mkdtemp(), durable_every=2)
        >>> for step in (1, 2, 3):
        ...     _ = store.save({"w": np.full(2, step)}, step=step)
        >>> [c.step for c in store.fast.checkpoints()], [c.step for c in store.durable.checkpoints()]
        ([2, 3], [2])
        >>> tree, info = store.restore()
        >>> info.step, tree["w"].tolist()
        (3, [3, 3])
    """

    def __init__(
        self,
        fast: str | os.PathLike[str],
        durable: str | os.PathLike[str] | CheckpointStore,
        *,
        durable_every: int = 5,
        keep_fast: int = 2,
    ) -> None:
        for label, value in (("durable_every", durable_every), ("keep_fast", keep_fast)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"`{label}` must be a positive int, got {value!r}.")
        if not isinstance(fast, str | os.PathLike):
            raise TypeError(f"`fast` must be a folder (a str or a path), got {type(fast).__name__}.")
        for label, given in (("fast", fast), ("durable", durable)):
            if isinstance(given, str | os.PathLike) and not os.fspath(given).strip():
                raise ValueError(f"`{label}` must name a folder, got {os.fspath(given)!r} (the working folder?).")
            if isinstance(given, str | os.PathLike) and os.path.exists(given) and not os.path.isdir(given):
                raise ValueError(f"`{label}` must be a folder, got {os.fspath(given)!r}, which is a file.")
        if isinstance(durable, TieredStore) or not isinstance(durable, CheckpointStore | str | os.PathLike):
            raise TypeError(
                f"`durable` must be a folder, a CheckpointStore or an OrbaxStore, got {type(durable).__name__}."
            )
        fast_root = Path(os.path.abspath(fast))
        durable_root = durable.root if isinstance(durable, CheckpointStore) else Path(os.path.abspath(durable))
        if fast_root == durable_root or durable_root in fast_root.parents or fast_root in durable_root.parents:
            raise ValueError(
                f"`fast` and `durable` must be separate folders, neither inside the other; got {str(fast_root)!r} "
                f"and {str(durable_root)!r}."
            )
        self.durable: CheckpointStore = durable if isinstance(durable, CheckpointStore) else open_store(durable)
        super().__init__(self.durable.root)
        self.fast_root = owned_fast_root(fast_root, Path(os.path.abspath(durable_root)))  # another run's: a subfolder
        self.fast = ShardStore(self.fast_root / f"process-{jax.process_index()}-of-{jax.process_count()}", self._agree)
        self.durable_every, self.keep_fast = durable_every, keep_fast
        # saves since the durable tier's newest, counted on across relaunches (process 0's count: all agree)
        self._since = int(json.loads(self._exchange("count", self._since_durable())[0]))
        self._last: _Last | None = None  # the newest save: what `finish` copies into the durable tier
        self._doomed: set[str] = set()  # deleted while the durable tier's newest: deleted once it has a newer one

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
        """Write ``tree`` into the fast tier, and into the durable one if this save is due there; return its info.

        The arguments are those of [`CheckpointStore.save`][ember.checkpoint.CheckpointStore.save].

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp(), durable_every=1)
            >>> store.save({"w": np.zeros(2)}, step=1).path == store.durable.root / "step_00000001"
            True
        """
        self.wait()
        durable = self._due(replaces)
        info = self.fast.save(tree, step=step, metrics=metrics, metadata=metadata, name=name, replaces=replaces)
        self._last = _Last(info.path.name, _abstract(tree, self.durable.collective_saves), durable)
        if durable:
            info = self.durable.save(tree, step=step, metrics=metrics, metadata=metadata, name=name, replaces=replaces)
        self._tidy(durable)
        return info

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
        """Copy ``tree`` now, then write it into the fast tier (and the durable one, when due) in the background.

        The fast tier's copy is made on the host before this returns; a save due in the durable tier is started there
        as that store starts one (see ``CheckpointStore.save_in_background``). ``then`` runs once both are on disk.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp())
            >>> _ = store.save_in_background({"w": np.zeros(2)}, step=1)
            >>> store.wait().path.parent == store.fast.root
            True
        """
        self.wait()
        durable = self._due(replaces)
        self.fast.save_in_background(tree, step=step, metrics=metrics, metadata=metadata, name=name, replaces=replaces)
        self._last = _Last(name or f"step_{step:08d}", _abstract(tree, self.durable.collective_saves), durable)
        if durable:
            self.durable.save_in_background(
                tree, step=step, metrics=metrics, metadata=metadata, name=name, replaces=replaces
            )
        self._pending = self._submit(self._settle, durable, then)
        return self._pending

    def _writing(self, name: str) -> bool:
        return self._last is not None and self._last.name == name and self.writing

    def _due(self, replaces: str | None) -> bool:
        """Whether the save being made goes into the durable tier too; count it (the fast tier's manifest says)."""
        self._since += 1
        due = self._since >= self.durable_every or (replaces is not None and (self.durable.root / replaces).is_dir())
        if due:
            self._since = 0
        self.fast.since_durable = self._since
        return due

    def _since_durable(self) -> int:
        """How many saves the fast tier has had since the durable tier's newest, as its newest manifest records."""
        fast, durable = self.fast.checkpoints(), self.durable.checkpoints()
        if not fast or (durable and newer(durable[-1]) >= newer(fast[-1])):
            return 0
        return int(fast[-1].manifest["layout"].get("since_durable", 0))

    def _settle(self, durable: bool, then: Callable[[], object] | None) -> CheckpointInfo:
        """On the writer thread: wait for both tiers' writes, tidy, then ``then``."""
        try:
            info = self.fast.wait()
        finally:
            if durable:
                info = self.durable.wait()
        self._tidy(durable)
        if then is not None:
            then()
        assert info is not None  # each tier had a save in flight
        return info

    def _tidy(self, durable: bool) -> None:
        """After a save: the fast tier keeps its newest ``keep_fast``; deletions put off for the durable tier happen."""
        self.fast.prune(keep_latest=self.keep_fast)
        if durable:
            newest = self._durable_newest()
            for name in sorted(self._doomed - {newest}):
                self.durable.delete(name)
                self._doomed.discard(name)

    def _durable_newest(self) -> str | None:
        found = self.durable.checkpoints()
        return found[-1].path.name if found else None

    def finish(self) -> CheckpointInfo | None:
        """Wait for the saves in flight; copy the last save into the durable tier if it is only in the fast one.

        A [`Checkpoint`][ember.handlers.Checkpoint] calls it when its run completes, on every process. The copy is
        read back from the fast tier (onto the devices for an ``OrbaxStore``, into host memory otherwise) and written
        as the durable store writes. Returns the durable checkpoint written, or ``None`` if there was nothing to copy.
        If the fast copy cannot be read back, a ``RuntimeWarning`` says the last save stays in the fast tier only.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp(), durable_every=10)
            >>> _ = store.save({"w": np.ones(2)}, step=3)
            >>> store.finish().step, [c.step for c in store.durable.checkpoints()]
            (3, [3])
        """
        self.wait()
        last = self._last
        if last is None or last.durable:
            return None
        info = self.fast.find(last.name)
        problem = self._agree(last.name, None if info is not None else NotHere("it is gone from the fast tier"))
        if info is None or problem is not None:
            warnings.warn(
                f"The last checkpoint, {last.name}, stays in the fast tier only ({problem}).",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        tree, _ = self.fast.restore(last.abstract, info)
        metadata = info.manifest.get("metadata", {})
        saved = self.durable.save(
            tree, step=info.step, metrics=info.metrics, metadata=metadata, name=last.name, replaces=last.name
        )
        last.durable = True
        self._tidy(True)
        return saved

    def close(self) -> None:
        """Wait for writes in flight and stop both tiers' writer threads.

        Examples:
            >>> import tempfile
            >>> from ember.checkpoint import TieredStore
            >>> TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp()).close()
        """
        super().close()
        self.fast.close()
        self.durable.close()

    def _amend(
        self,
        previous: Future[CheckpointInfo] | None,
        name: str,
        metrics: Mapping[str, float] | None,
        metadata: Mapping[str, Any] | None,
    ) -> CheckpointInfo:
        """Rewrite checkpoint ``name``'s manifest in each tier that holds it, once ``previous`` is on disk.

        ``amend`` and ``amend_in_background`` (the store's) call it, in the caller's thread or on the writer's.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp(), durable_every=1)
            >>> _ = store.save({"w": np.ones(2)}, step=3)
            >>> store.amend("step_00000003", metrics={"loss": 0.5}).metrics, store.fast.latest().metrics
            ({'loss': 0.5}, {'loss': 0.5})
        """
        if previous is not None:
            previous.result()  # on disk in both tiers (or its error is this one's)
        found = [tier for tier in (self.fast, self.durable) if (tier.root / name).is_dir()]
        if not found:
            raise FileNotFoundError(f"No checkpoint named {name!r} in {self.fast.root} or {self.root}.")
        return [tier.amend(name, metrics=metrics, metadata=metadata) for tier in found][-1]

    def delete(self, checkpoint: CheckpointInfo | str) -> None:
        """Remove a checkpoint from both tiers; the durable tier's newest goes once that tier has a newer one.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp(), durable_every=2)
            >>> for step in (1, 2, 3):
            ...     _ = store.save({"w": np.zeros(1)}, step=step)
            >>> store.delete("step_00000002"); [c.step for c in store.checkpoints()]  # durable's newest stays
            [2, 3]
        """
        name = checkpoint.path.name if isinstance(checkpoint, CheckpointInfo) else checkpoint
        self.fast.delete(name)
        if (self.durable.root / name).is_dir():
            if name == self._durable_newest():
                self._doomed.add(name)
            else:
                self.durable.delete(name)

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
        """[`CheckpointFolder.prune`][ember.checkpoint.CheckpointFolder.prune] in each tier; the deleted, both tiers'.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp(), durable_every=1, keep_fast=5)
            >>> for step in (1, 2, 3):
            ...     _ = store.save({"w": np.zeros(1)}, step=step)
            >>> len(store.prune(keep_latest=1)), [c.step for c in store.checkpoints()]
            (4, [3])
        """
        policy: dict[str, Any] = {"keep_latest": keep_latest, "keep_best": keep_best, "metric": metric, "mode": mode}
        policy.update(keep_every=keep_every, prefix=prefix)
        return self.fast.prune(**policy) + self.durable.prune(**policy)


@dataclass
class _Last:
    """The newest save: its name, its tree's structure (for reading it back), and whether the durable tier has it."""

    name: str
    abstract: Any
    durable: bool


def _abstract(tree: Any, sharded: bool) -> Any:
    """``tree`` with each array as a ``jax.ShapeDtypeStruct`` (with its sharding if ``sharded``): what to read back."""

    def one(x: Any) -> Any:
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding if sharded else None)
        if isinstance(x, np.ndarray):
            return jax.ShapeDtypeStruct(x.shape, x.dtype)
        return x

    return jax.tree.map(one, tree)
