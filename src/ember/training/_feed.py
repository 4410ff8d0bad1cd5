"""`StepGroups`: feed K steps per compiled call while the engine still sees one batch per step."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import numpy as np

from ember.training._batch_spec import BatchSpec


class StepGroups:
    """Reads K host batches at a time, stacks them, and puts each group on device ahead of time.

    Iterating yields the host batches one by one, so the engine fires its events per step; while the
    first batch of a group is current, :attr:`group` holds the whole group stacked on a leading axis
    (already on device) and :attr:`slot` is 0. The last group of a pass may be shorter than K.
    """

    def __init__(self, source: Iterable[Any], k: int, put: Callable[[Any], Any], prefetch: int) -> None:
        self.source = source
        self.k = k
        self.put = put
        self.prefetch = prefetch
        self.group: Any = None
        self.host_group: Any = None
        self.size = 0
        self.slot = -1

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        return self._steps(iter(self.source))

    def _read_group(self, it: Iterator[Any]) -> tuple[Any, Any, list[Any]] | None:
        host: list[Any] = []
        for batch in it:
            host.append(batch)
            if len(host) == self.k:
                break
        if not host:
            return None
        try:
            stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *host)
        except ValueError:
            spec = BatchSpec(host[0])
            for batch in host[1:]:
                spec.check(batch)  # raises the clear error: which batch differs, and how
            raise
        return self.put(stacked), stacked, host

    def _steps(self, it: Iterator[Any]) -> Iterator[Any]:
        queue: collections.deque[tuple[Any, Any, list[Any]]] = collections.deque()

        def fill(n: int) -> None:
            while len(queue) < n:
                group = self._read_group(it)
                if group is None:
                    return
                queue.append(group)

        while True:
            fill(max(self.prefetch, 1))  # at least the group to run now
            if not queue:
                return
            group, stacked, host = queue.popleft()
            fill(self.prefetch)  # and `prefetch` more already travelling
            self.group, self.host_group, self.size = group, stacked, len(host)
            for slot, batch in enumerate(host):
                self.slot = slot
                yield batch
