"""The read side of a `TieredStore`: its two tiers listed, ranked, verified and restored as one store."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from ember._multiprocess import exchange
from ember.checkpoint._info import CheckpointInfo
from ember.checkpoint._manifest import CorruptCheckpointError
from ember.checkpoint._order import check_mode, newer, preferred
from ember.checkpoint._shards import NotHere, ShardStore, verdict
from ember.checkpoint._store import CheckpointStore


class TieredReading:
    """What a [`TieredStore`][ember.checkpoint.TieredStore] reads with: it inherits this (before ``CheckpointStore``).

    Every method is that of [`CheckpointFolder`][ember.checkpoint.CheckpointFolder] over the fast tier (this process's
    folder of it) and the durable tier together.
    """

    root: Path
    fast: ShardStore
    durable: CheckpointStore
    _writing: Callable[[str], bool]  # whether the newest save, still in flight, is ``name``

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
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp(), durable_every=2)
            >>> for step in (1, 2, 3):
            ...     _ = store.save({"w": np.zeros(1)}, step=step)
            >>> [(c.step, "fast" if c.path.parent == store.fast.root else "durable") for c in store.ranked()]
            [(3, 'fast'), (2, 'fast'), (2, 'durable')]
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
        """Read ``info`` through the tier that holds it; ``restore`` (the folder's) goes down the ranked list.

        A fast checkpoint that some process cannot give (damaged, gone, saved with another layout) raises, on every
        process, and the next is read: the same step or an older one from the durable tier.

        Examples:
            >>> import tempfile, shutil, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> fast = tempfile.mkdtemp()
            >>> store = TieredStore(fast, tempfile.mkdtemp(), durable_every=2)
            >>> for step in (1, 2, 3):
            ...     _ = store.save({"w": np.full(1, step)}, step=step)
            >>> shutil.rmtree(fast)  # the machine was replaced
            >>> TieredStore(fast, store.durable.root).restore()[1].step
            2
        """
        tier = self.fast if self.fast.holds(info) else self.durable
        return tier.restore(target, info, on_verified=on_verified)[0]

    def _places(self) -> str:
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
        return fast if fast.is_dir() or self._writing(name) else self.durable.path_of(name)

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
