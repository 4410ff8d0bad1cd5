"""`StepOutput`: one step's view of the outputs of a K-step compiled call, sliced only when read."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jax


class StepOutput(Mapping[str, Any]):
    """Step ``index`` of a K-step call's stacked outputs; reading a key slices it (once) on device.

    Handlers use it like the dict a single step returns (``output["loss"]``); a key nobody reads is never
    sliced, so K steps per call cost one output per leaf, not K. ``dict(output)`` gives every value, sliced.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.training import StepOutput
        >>> out = StepOutput({"loss": jnp.array([0.5, 0.25])}, 1)
        >>> float(out["loss"]), list(out)
        (0.25, ['loss'])
    """

    __slots__ = ("_cache", "_index", "_stacked")

    def __init__(self, stacked: Mapping[str, Any], index: int) -> None:
        self._stacked = stacked
        self._index = index
        self._cache: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        try:
            return self._cache[key]
        except KeyError:
            value = jax.tree.map(lambda x: x[self._index], self._stacked[key])
            self._cache[key] = value
            return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._stacked)

    def __len__(self) -> int:
        return len(self._stacked)

    def __repr__(self) -> str:
        return f"StepOutput(step {self._index} of {sorted(self._stacked)})"
