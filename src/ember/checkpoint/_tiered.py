"""`TieredStore`: every save into a fast tier (each process's own folder), every k-th and the last into a durable."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jax
import numpy as np

from ember._multiprocess import exchange
from ember.checkpoint._fast_owner import durable_id, fast_root_of
from ember.checkpoint._folder import check_mode, newer, preferred
from ember.checkpoint._manifest import CheckpointInfo, CorruptCheckpointError
from ember.checkpoint._orbax import open_store
from ember.checkpoint._shards import NotHere, SaveCount, ShardFormat, verdict
from ember.checkpoint._store import CheckpointStore, Metadata, Metrics, Save, Store, Then


class TieredStore(Store):
    """Checkpoints in two tiers: every save into a fast folder, every ``durable_every``-th and the last into a durable.

    The fast tier is a folder on local, quick storage (``/dev/shm/run``, a node's NVMe) that a relaunch on the same
    machine finds again; each process writes its own shards there, into
    ``<durable folder's name>-<its id>/process-<i>-of-<n>``, without waiting for the others, and keeps its newest
    ``keep_fast``. The durable tier's id (in its ``.tier-id`` file, made at its first use) keeps runs apart: two runs
    given one fast folder never read each other's checkpoints, and a durable folder made anew at the same path starts
    afresh rather than resume an older run's fast checkpoints. The durable
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

    It is a composite: it holds two stores (the fast tier is a ``CheckpointStore`` writing each process's shards),
    each writing on its own thread, and reads, waits for and closes them as one store.

    Args:
        fast: the fast tier's folder (several runs may share it: each keeps its checkpoints in a folder inside).
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
        fast_root = fast_root_of(fast, durable, durable_every=durable_every, keep_fast=keep_fast)
        durable_store = durable if isinstance(durable, CheckpointStore) else open_store(durable)
        super().__init__(durable_store.root, durable_store.format)
        # the folder of this durable tier's fast checkpoints, named by its id (process 0 reads it, or makes one)
        ident = json.loads(self._exchange("id", durable_id(self.root) if jax.process_index() == 0 else None)[0])
        self.fast_root = fast_root / f"{self.root.name}-{ident}"
        # saves since the durable tier's newest, which each fast save's manifest records (the relaunch counts on)
        self._count = SaveCount()
        own = self.fast_root / f"process-{jax.process_index()}-of-{jax.process_count()}"
        self.fast = CheckpointStore(own, format=ShardFormat(self._agree, self._count))
        self.durable = durable_store
        self.durable_every, self.keep_fast = durable_every, keep_fast
        # process 0's count: all agree
        self._count.since_durable = int(json.loads(self._exchange("count", self._since_durable())[0]))
        self._last: _Last | None = None  # the newest save: what `finish` copies into the durable tier
        self._doomed: set[str] = set()  # deleted while the durable tier's newest: deleted once it has a newer one

    # -- writing ---------------------------------------------------------------------------------

    def _parts(self) -> tuple[CheckpointStore, ...]:
        return (self.fast, self.durable)

    def _submit(self, save: Save, *, background: bool) -> Future[CheckpointInfo]:
        """Into the fast tier, and the durable one when due; ``removes`` and ``then`` once both are on disk."""
        self.wait()
        durable = self._due(save.replaces)
        name = save.name or f"step_{save.step:08d}"
        self._last = _Last(name, _abstract(save.tree, self.durable.format.sharded), durable)
        tier = dataclasses.replace(save, removes=[], then=self._tidy_fast)
        if not durable:
            done = functools.partial(self._after, None, self._tidy_fast, save.removes, save.then)
            return self.fast._submit(dataclasses.replace(tier, then=done), background=background)
        fast = self.fast._submit(tier, background=background)
        done = functools.partial(self._after, fast, self._tidy_durable, save.removes, save.then)
        return self.durable._submit(dataclasses.replace(tier, then=done), background=background)

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

    def _submit_amend(self, name: str, metrics: Metrics, metadata: Metadata, then: Then) -> Future[CheckpointInfo]:
        """Amend ``name`` in each tier that holds it, after the save in flight there; ``then`` once both are done."""
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

    def _pruned(self) -> tuple[CheckpointStore, ...]:
        return (self.fast, self.durable)

    # -- reading ---------------------------------------------------------------------------------

    def checkpoints(self) -> list[CheckpointInfo]:
        """Every valid checkpoint of both tiers, oldest step first; of a step in both, the fast tier's.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp(), durable_every=2)
            >>> for step in (1, 2, 3):
            ...     _ = store.save({"w": np.zeros(1)}, step=step)
            >>> [(c.step, c.path.parent.name) for c in store.checkpoints()]
            [(2, 'process-0-of-1'), (3, 'process-0-of-1')]
        """
        merged = {c.path.name: c for c in self.durable.checkpoints()}
        merged.update({c.path.name: c for c in self.fast.checkpoints()})
        return sorted(merged.values(), key=newer)

    def ranked(self, metric: str | None = None, mode: Literal["min", "max"] = "max") -> list[CheckpointInfo]:
        """Valid checkpoints of both tiers, preferred first (see ``CheckpointFolder.ranked``).

        A step both tiers hold is listed twice, the fast tier's copy first, so a restore that cannot read it reads the
        other.

        A fast checkpoint is listed only where every process holds it; in a multi-process run every process calls this
        together, as it restores together.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp(), durable_every=1)
            >>> _ = store.save({"w": np.zeros(1)}, step=1); _ = store.save({"w": np.ones(1)}, step=2)
            >>> [(c.step, "fast" if c.path.parent == store.fast.root else "durable") for c in store.ranked()]
            [(2, 'fast'), (2, 'durable'), (1, 'fast'), (1, 'durable')]
        """
        check_mode(mode)
        fast = self.fast.ranked()
        everywhere = set.intersection(
            *(set(json.loads(v)) for v in self._exchange("list", [c.path.name for c in fast]))
        )
        durable = {c.path.name: c for c in self.durable.ranked()}
        merged = {**durable, **{c.path.name: c for c in fast if c.path.name in everywhere}}
        order = preferred(list(merged.values()), metric, mode)  # a step in both tiers: the fast copy, then the other
        listed = []
        for c in order:
            listed.append(c)
            if self.fast.holds(c) and c.path.name in durable:
                listed.append(durable[c.path.name])
        return listed

    def _read(self, info: CheckpointInfo, target: Any, on_verified: Callable[[], object] | None) -> Any:
        tier = self.fast if self.fast.holds(info) else self.durable
        return tier.restore(target, info, on_verified=on_verified)[0]

    def _where(self) -> str:
        return f"{self.fast.root} or {self.root}"

    def verify(self, path: str | os.PathLike[str], *, full: bool = False) -> CheckpointInfo:
        """The info of the checkpoint in folder ``path``, of whichever tier holds it (see ``CheckpointFolder.verify``).

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp())
            >>> store.verify(store.save({"w": np.zeros(1)}, step=4).path, full=True).step
            4
        """
        tier = self.fast if Path(path).parent == self.fast.root else self.durable
        return tier.verify(path, full=full)

    def set_aside(self, path: Path, why: Exception) -> None:
        """Move a damaged checkpoint aside in its tier; a fast one intact here (another process's is not) only warns.

        Examples:
            >>> import tempfile, warnings, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp())
            >>> info = store.save({"w": np.zeros(1)}, step=1)
            >>> with warnings.catch_warnings(record=True) as caught:
            ...     warnings.simplefilter("always")
            ...     store.set_aside(info.path, ValueError("Process 1 has no step_00000001."))
            >>> print(caught[0].message)
            Process 1 has no step_00000001. It was skipped.
        """
        if Path(path).parent != self.fast.root:
            self.durable.set_aside(path, why)
            return
        try:
            self.fast.verify(path, full=True)
        except ValueError:  # damaged here (CorruptCheckpointError), or gone
            self.fast.set_aside(path, why)
            return
        warnings.warn(f"{why} It was skipped.", UserWarning, stacklevel=3)

    def find(self, name: str) -> CheckpointInfo | None:
        """The valid checkpoint named ``name`` in the fast tier, else in the durable one, else ``None``.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp())
            >>> _ = store.save({"w": np.zeros(1)}, step=7)
            >>> store.find("step_00000007").path.parent.name
            'process-0-of-1'
        """
        return self.fast.find(name) or self.durable.find(name)

    def holds(self, info: CheckpointInfo) -> bool:
        """Whether ``info`` is a checkpoint of either tier.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp())
            >>> store.holds(store.save({"w": np.zeros(1)}, step=1))
            True
        """
        return self.fast.holds(info) or self.durable.holds(info)

    # -- agreeing ----------------------------------------------------------------------------------

    def _exchange(self, what: str, value: Any) -> list[str]:
        """Every process's ``value`` (JSON) for this store's round of ``what``."""
        return exchange(f"tiered-{what}:{self.root}", json.dumps(value))

    def _agree(self, checkpoint: CheckpointInfo | str, problem: BaseException | None) -> BaseException | None:
        """Every process's verdict on restoring ``checkpoint`` from its fast tier: the first problem, or ``None``."""
        everyone = exchange(f"tiered-read:{self.root}", verdict(problem))
        if problem is not None:
            return problem
        name = checkpoint.path.name if isinstance(checkpoint, CheckpointInfo) else checkpoint
        for process, text in enumerate(everyone):
            found = json.loads(text)
            if found is not None:
                kind = NotHere if found[0] == NotHere.__name__ else CorruptCheckpointError
                return kind(f"Process {process} cannot restore {name} from its fast tier: {found[1]}")
        return None


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
