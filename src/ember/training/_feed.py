"""`StepGroups`: feed K steps per compiled call while the engine still sees one batch per step."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import numpy as np

from ember.data import DevicePrefetch, Mapped
from ember.training._batch_spec import BatchSpec


class _Groups:
    """The source's batches read K at a time: ``(stacked, host_batches, positions)`` per group.

    ``positions[i]`` is the source's position after ``host_batches[i]`` (``None`` where it has none).
    """

    def __init__(self, source: Iterable[Any], k: int) -> None:
        self.source = source
        self.k = k

    def __iter__(self) -> Iterator[tuple[Any, list[Any], list[Any]]]:
        return _GroupReader(iter(self.source), self.k)


class _GroupReader(Mapped):
    """One pass of `_Groups`; its position is the source's, after the latest group."""

    def __init__(self, it: Iterator[Any], k: int) -> None:
        super().__init__(it, lambda group: group)
        self.k = k

    def __next__(self) -> tuple[Any, list[Any], list[Any]]:
        host: list[Any] = []
        positions: list[Any] = []
        for batch in self._it:
            host.append(batch)
            positions.append(self.get_state())
            if len(host) == self.k:
                break
        if not host:
            raise StopIteration
        return _stack(host), host, positions


def _stack(host: list[Any]) -> Any:
    try:
        return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *host)
    except ValueError:
        spec = BatchSpec(host[0])
        for batch in host[1:]:
            spec.check(batch)  # raises the clear error: which batch differs, and how
        raise


class StepGroups:
    """Reads K host batches at a time, stacks them, and puts each group on device ahead of time.

    Iterating yields the host batches one by one, so the engine fires its events per step; while the first batch of a
    group is current, `group` holds the whole group stacked on a leading axis (placed for the step) and `slot` is 0. The
    last group of a pass may be shorter than K. Groups travel ahead through the same
    [`DevicePrefetch`][ember.data.DevicePrefetch] that single batches use.
    """

    def __init__(
        self,
        source: Iterable[Any],
        k: int,
        put: Callable[[Any], Any],
        prefetch: int,
        decide: Callable[[Any], int] | None = None,
    ) -> None:
        self.source = source
        self.group: Any = None
        self.size = 0
        self.slot = -1
        self._groups = DevicePrefetch(
            _Groups(source, k),
            lambda g: (put(g[0]), *g[1:]),
            size=prefetch,
            decide=None if decide is None else lambda g: decide(g[0]),
        )

    def __len__(self) -> int:
        # the ignore below: only called when the source has a len (checked by the caller)
        return len(self.source)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        return _Steps(self, iter(self._groups))


class _Steps(Mapped):
    """One pass of `StepGroups`: the host batches one by one; the position is after the current one."""

    def __init__(self, owner: StepGroups, groups: Iterator[Any]) -> None:
        super().__init__(groups, lambda group: group)
        self._owner = owner
        self._host: list[Any] = []
        self._positions: list[Any] = []
        self._slot = -1

    def __next__(self) -> Any:
        owner = self._owner
        if self._slot + 1 >= len(self._host):
            owner.group, self._host, self._positions = next(self._it)
            owner.size = len(self._host)
            self._slot = -1
        self._slot += 1
        owner.slot = self._slot
        return self._host[self._slot]

    def get_state(self) -> Any:
        """The source's position after the current batch (``None`` if it has none)."""
        return self._positions[self._slot] if self._positions else super().get_state()

    def set_state(self, state: Any) -> None:
        """Continue from a saved position: the next group starts right after it."""
        super().set_state(state)
        self._host, self._positions, self._slot = [], [], -1
