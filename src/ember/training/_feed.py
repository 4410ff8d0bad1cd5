"""`StepGroups`: feed K steps per compiled call while the engine still sees one batch per step."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import numpy as np

from ember.data import DevicePrefetch
from ember.training._batch_spec import BatchSpec


class _Groups:
    """The source's batches read K at a time: ``(stacked, host_batches)`` per group, stacked on the host."""

    def __init__(self, source: Iterable[Any], k: int) -> None:
        self.source = source
        self.k = k

    def __iter__(self) -> Iterator[tuple[Any, list[Any]]]:
        it = iter(self.source)
        while True:
            host: list[Any] = []
            for batch in it:
                host.append(batch)
                if len(host) == self.k:
                    break
            if not host:
                return
            yield _stack(host), host


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

    Iterating yields the host batches one by one, so the engine fires its events per step; while the
    first batch of a group is current, :attr:`group` holds the whole group stacked on a leading axis
    (placed for the step) and :attr:`slot` is 0. The last group of a pass may be shorter than K. Groups
    travel ahead through the same :class:`~ember.data.DevicePrefetch` that single batches use.
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
        self.host_group: Any = None
        self.size = 0
        self.slot = -1
        self._groups = DevicePrefetch(
            _Groups(source, k),
            lambda g: (put(g[0]), g[0], g[1]),
            size=prefetch,
            decide=None if decide is None else lambda g: decide(g[0]),
        )

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        for group, stacked, host in self._groups:
            self.group, self.host_group, self.size = group, stacked, len(host)
            for slot, batch in enumerate(host):
                self.slot = slot
                yield batch
