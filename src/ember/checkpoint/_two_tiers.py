"""`TwoTiers`: a `TieredStore`'s two stores as one: listed, ranked, verified, restored, waited for and closed."""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from ember._multiprocess import exchange
from ember.checkpoint._folder import first_readable
from ember.checkpoint._info import CheckpointInfo, check_mode, newer, preferred
from ember.checkpoint._manifest import CorruptCheckpointError
from ember.checkpoint._shards import NotHere, verdict
from ember.checkpoint._store import CheckpointStore


class TwoTiers:
    """The two tiers of a [`TieredStore`][ember.checkpoint.TieredStore], held as one store: read, waited for, closed.

    It holds the fast tier (this process's folder of it) and the durable tier, each a
    [`CheckpointStore`][ember.checkpoint.CheckpointStore] with its own writer thread; each method is that of a
    store over both together. ``TieredStore`` adds the policy of saving: which save goes where, and what is kept.

    Examples:
        >>> import tempfile, numpy as np
        >>> from ember.checkpoint import TieredStore
        >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp(), durable_every=2)
        >>> _ = store.save({"w": np.zeros(1)}, step=1)
        >>> store.latest().step, store.root == store.durable.root
        (1, True)
    """

    def __init__(self, fast: CheckpointStore, durable: CheckpointStore) -> None:
        self.fast, self.durable = fast, durable
        self.root = durable.root

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

    def latest(self) -> CheckpointInfo | None:
        """The valid checkpoint of either tier with the highest step, or ``None``.

        Examples:
            >>> import tempfile
            >>> from ember.checkpoint import TieredStore
            >>> TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp()).latest() is None
            True
        """
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def best(self, metric: str, mode: Literal["min", "max"] = "max") -> CheckpointInfo | None:
        """The valid checkpoint of either tier with the best value of ``metric`` (ties: the later step), or ``None``.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp())
            >>> for step, acc in ((1, 0.7), (2, 0.9), (3, 0.8)):
            ...     _ = store.save({"w": np.zeros(1)}, step=step, metrics={"accuracy": acc})
            >>> store.best("accuracy").step
            2
        """
        ranked = self.ranked(metric, mode)
        return ranked[0] if ranked else None

    def restore(
        self,
        target: Any = None,
        checkpoint: CheckpointInfo | None = None,
        *,
        on_verified: Callable[[], object] | None = None,
    ) -> tuple[Any, CheckpointInfo]:
        """Read the newest checkpoint of either tier that reads back whole (or ``checkpoint``), through its tier.

        The arguments are those of [`CheckpointFolder.restore`][ember.checkpoint.CheckpointFolder.restore]. A fast
        checkpoint that some process cannot give (damaged, gone, saved with another layout) raises, on every process,
        and the next is read: the same step or an older one from the durable tier.

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

        def read(info: CheckpointInfo) -> Any:
            tier = self.fast if self.fast.holds(info) else self.durable
            return tier.restore(target, info, on_verified=on_verified)[0]

        if checkpoint is not None:
            return read(checkpoint), checkpoint
        return first_readable(self.ranked(), read, self.set_aside, f"{self.fast.root} or {self.root}")

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

    def close(self) -> None:
        """Wait for writes in flight and stop both tiers' writer threads.

        Examples:
            >>> import tempfile
            >>> from ember.checkpoint import TieredStore
            >>> TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp()).close()
        """
        try:
            self.wait()
        finally:
            try:
                self.fast.close()
            finally:
                self.durable.close()

    def wait(self, timeout: float | None = None) -> CheckpointInfo | None:
        """Block until both tiers' writes are on disk; re-raise an error of either; return the last save's info.

        With ``timeout`` (seconds, for both together), raise ``TimeoutError`` if they are not done by then.

        Examples:
            >>> import tempfile, numpy as np
            >>> from ember.checkpoint import TieredStore
            >>> store = TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp(), durable_every=1)
            >>> _ = store.save_in_background({"w": np.zeros(2)}, step=1)
            >>> store.wait().path.parent == store.durable.root
            True
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            try:
                info = self.fast.wait(timeout)
            finally:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                durable = self.durable.wait(left)
        except TimeoutError:  # the store's own folder named, as a CheckpointStore's wait names its
            raise TimeoutError(
                f"The checkpoint being written into {self.root} was not done within {timeout} s."
            ) from None
        return durable if durable is not None else info

    @property
    def writing(self) -> bool:
        """Whether either tier has a background write that was not yet waited for.

        Examples:
            >>> import tempfile
            >>> from ember.checkpoint import TieredStore
            >>> TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp()).writing
            False
        """
        return self.fast.writing or self.durable.writing

    @property
    def busy(self) -> bool:
        """Whether either tier has a write in progress now (started and not finished).

        Examples:
            >>> import tempfile
            >>> from ember.checkpoint import TieredStore
            >>> TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp()).busy
            False
        """
        return self.fast.busy or self.durable.busy

    def raise_if_failed(self) -> None:
        """Re-raise the error of either tier's background write that has already failed; never blocks.

        Examples:
            >>> import tempfile
            >>> from ember.checkpoint import TieredStore
            >>> TieredStore(tempfile.mkdtemp(), tempfile.mkdtemp()).raise_if_failed()
        """
        try:
            self.fast.raise_if_failed()
        finally:
            self.durable.raise_if_failed()

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
