"""`TieredStore`: every save into a fast tier (each process's own folder), every k-th and the last into a durable."""

from __future__ import annotations

import functools
import json
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jax
import numpy as np

from ember.checkpoint._fast_owner import owned_fast_root, tier_roots
from ember.checkpoint._info import CheckpointInfo, newer
from ember.checkpoint._manifest import new_manifest
from ember.checkpoint._orbax import open_store
from ember.checkpoint._shards import NotHere, SaveCount, ShardFormat
from ember.checkpoint._store import CheckpointStore
from ember.checkpoint._two_tiers import TwoTiers


class TieredStore(TwoTiers):
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

    It is a composite, not a store of its own: it holds two stores (the fast tier is a ``CheckpointStore`` writing
    each process's shards), and each tier writes on its own one writer thread.

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
        fast_root, durable_root = tier_roots(fast, durable, durable_every=durable_every, keep_fast=keep_fast)
        durable_store = durable if isinstance(durable, CheckpointStore) else open_store(durable)
        self.fast_root = owned_fast_root(fast_root, Path(os.path.abspath(durable_root)))  # another run's: a subfolder
        # saves since the durable tier's newest, which each fast save's manifest records (the relaunch counts on)
        self._count = SaveCount()
        own = self.fast_root / f"process-{jax.process_index()}-of-{jax.process_count()}"
        super().__init__(CheckpointStore(own, format=ShardFormat(self._agree, self._count)), durable_store)
        self.durable_every, self.keep_fast = durable_every, keep_fast
        # process 0's count: all agree
        self._count.since_durable = int(json.loads(self._exchange("count", self._since_durable())[0]))
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

        The background save and a wait for it. The arguments are those of
        [`CheckpointStore.save`][ember.checkpoint.CheckpointStore.save].

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp(), durable_every=1)
            >>> store.save({"w": np.zeros(2)}, step=1).path == store.durable.root / "step_00000001"
            True
        """
        self.save_in_background(tree, step=step, metrics=metrics, metadata=metadata, name=name, replaces=replaces)
        info = self.wait()
        assert info is not None  # the save just started
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
        removes: Sequence[str] = (),
    ) -> Future[CheckpointInfo]:
        """Copy ``tree`` now, then write it into the fast tier (and the durable one, when due) in the background.

        The fast tier's copy is made on the host before this returns; a save due in the durable tier is started there
        as that store starts one (see ``CheckpointStore.save_in_background``). Once both are on disk, the checkpoints
        named in ``removes`` are deleted (`delete`), then ``then`` runs.

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
        self._last = _Last(name or f"step_{step:08d}", _abstract(tree, self.durable.format.sharded), durable)
        args: dict[str, Any] = {"step": step, "metrics": metrics, "metadata": metadata, "name": name}
        if not durable:
            done = functools.partial(self._after, None, self._tidy_fast, list(removes), then)
            return self.fast.save_in_background(tree, **args, replaces=replaces, then=done)
        fast = self.fast.save_in_background(tree, **args, replaces=replaces, then=self._tidy_fast)
        done = functools.partial(self._after, fast, self._tidy_durable, list(removes), then)
        return self.durable.save_in_background(tree, **args, replaces=replaces, then=done)

    def _after(
        self,
        fast: Future[CheckpointInfo] | None,
        tidy: Callable[[], None] | None,
        removes: list[str],
        then: Callable[[], object] | None,
    ) -> None:
        """On the last tier's writer thread, once both tiers' writes are done: ``tidy`` that tier, delete ``removes``.

        Each tier is tidied on its own thread (the fast tier after its write, the durable tier here). Nothing runs if
        the fast tier's write failed: its error is the one [`wait`][ember.checkpoint.TieredStore.wait] raises, once.
        """
        if fast is not None and fast.exception() is not None:
            return
        if tidy is not None:
            tidy()
        for old in removes if jax.process_index() == 0 else ():  # process 0 removes, as a handler's retention did
            self.delete(old)
        if then is not None:
            then()

    @property
    def last_save_durable(self) -> bool:
        """Whether the newest save went into the durable tier too (``False`` before the first save).

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp(), durable_every=2)
            >>> [(store.save({"w": np.zeros(2)}, step=s), store.last_save_durable)[1] for s in (1, 2)]
            [False, True]
        """
        return self._last is not None and self._last.durable

    def _due(self, replaces: str | None) -> bool:
        """Whether the save being made goes into the durable tier too; count it (the fast tier's manifest says)."""
        self._count.since_durable += 1
        due = self._count.since_durable >= self.durable_every
        if due or (replaces is not None and (self.durable.root / replaces).is_dir()):
            self._count.since_durable = 0
            return True
        return False

    def _since_durable(self) -> int:
        """How many saves the fast tier has had since the durable tier's newest, as its newest manifest records."""
        fast, durable = self.fast.checkpoints(), self.durable.checkpoints()
        if not fast or (durable and newer(durable[-1]) >= newer(fast[-1])):
            return 0
        return int(fast[-1].manifest["layout"].get("since_durable", 0))

    def _tidy_fast(self) -> None:
        """After a save: the fast tier keeps its newest ``keep_fast``."""
        self.fast.prune(keep_latest=self.keep_fast)

    def _tidy_durable(self) -> None:
        """After a durable save: the deletions put off for the durable tier's newest happen."""
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
        self._tidy_fast()
        self._tidy_durable()
        return saved

    def amend(
        self, name: str, *, metrics: Mapping[str, float] | None = None, metadata: Mapping[str, Any] | None = None
    ) -> CheckpointInfo:
        """Rewrite checkpoint ``name``'s manifest in each tier that holds it (see ``CheckpointStore.amend``).

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp(), durable_every=1)
            >>> _ = store.save({"w": np.ones(2)}, step=3)
            >>> store.amend("step_00000003", metrics={"loss": 0.5}).metrics, store.fast.latest().metrics
            ({'loss': 0.5}, {'loss': 0.5})
        """
        self.amend_in_background(name, metrics=metrics, metadata=metadata)
        info = self.wait()
        assert info is not None  # the amendment just started
        return info

    def amend_in_background(
        self,
        name: str,
        *,
        metrics: Mapping[str, float] | None = None,
        metadata: Mapping[str, Any] | None = None,
        then: Callable[[], object] | None = None,
    ) -> Future[CheckpointInfo]:
        """``amend`` on each tier's writer thread, after the save in flight there; ``then`` once both are done.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp(), durable_every=1)
            >>> _ = store.save_in_background({"w": np.ones(2)}, step=3)
            >>> _ = store.amend_in_background("step_00000003", metrics={"loss": 0.5})
            >>> store.wait().metrics, store.fast.latest().metrics
            ({'loss': 0.5}, {'loss': 0.5})
        """
        new_manifest(0, metrics, metadata)  # JSON, or a TypeError here, in the caller's thread
        tiers = self._holding(name)
        fast = tiers[0].amend_in_background(name, metrics=metrics, metadata=metadata) if len(tiers) == 2 else None
        done = functools.partial(self._after, fast, None, [], then)
        return tiers[-1].amend_in_background(name, metrics=metrics, metadata=metadata, then=done)

    def _holding(self, name: str) -> list[CheckpointStore]:
        """The tiers that hold checkpoint ``name``, or are writing it (the newest save), fast first."""
        last = self._last if self._last is not None and self._last.name == name else None
        found = [self.fast] if last is not None or (self.fast.root / name).is_dir() else []
        if (last is not None and last.durable) or (self.durable.root / name).is_dir():
            found.append(self.durable)
        if not found:
            raise FileNotFoundError(f"No checkpoint named {name!r} in {self.fast.root} or {self.root}.")
        return found

    def path_of(self, name: str) -> Path:
        """The fast tier's folder of checkpoint ``name`` if that tier holds it (or is writing it), else the durable's.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp())
            >>> _ = store.save({"w": np.zeros(1)}, step=7)
            >>> store.path_of("step_00000007").parent == store.fast.root
            True
        """
        fast = self.fast.root / name
        writing = self._last is not None and self._last.name == name and self.writing
        return fast if fast.is_dir() or writing else self.durable.path_of(name)

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


#: one of ember's stores, as handlers take it (``isinstance(x, Store)`` tells it from a user's own save handler)
Store = CheckpointStore | TieredStore
