"""What a `Checkpoint` compares to tell whether a save repeats the last one: its step, states, score and arrays."""

from __future__ import annotations

import numbers
import weakref
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np


def score_of(value: Any) -> float:
    """A ``score_function``'s result as a number (a Python int stays one), or a ``ValueError`` saying what it was."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float | np.number | np.ndarray | jax.Array)
        or (np.ndim(value) != 0)
    ):
        raise ValueError(
            f"`score_function` must return a number (a float, or a 0-d array), got {value!r} of type "
            f"{type(value).__name__}."
        )
    return int(value) if isinstance(value, numbers.Integral) else float(value)


@dataclass
class Saved:
    """A checkpoint a `Checkpoint` wrote (or resumed from): its step, name, states, metrics, and its arrays.

    The arrays are held by weak reference (or, for Python scalars, by value): a train state is replaced, never
    changed in place, so the same objects mean the same values, and nothing is kept alive for the comparison.
    """

    step: int
    name: str
    leaves: list[tuple[str, Any]]
    states: dict[str, Any]
    metrics: dict[str, float]

    @classmethod
    def of(
        cls, step: int, name: str, trees: dict[str, Any], states: dict[str, Any], metrics: dict[str, float]
    ) -> Saved:
        return cls(step, name, _references(trees), states, metrics)

    def holds(self, trees: dict[str, Any]) -> bool:
        """Whether ``trees`` are the very arrays this checkpoint holds."""
        now = _flat(trees)
        if [path for path, _ in now] != [path for path, _ in self.leaves]:
            return False
        for (_, ref), (_, leaf) in zip(self.leaves, now, strict=True):
            if isinstance(ref, weakref.ref):
                if ref() is not leaf:
                    return False
            elif type(ref) is not type(leaf) or ref != leaf:
                return False
        return True


def _flat(trees: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(f"{name}/{path}", leaf) for name, tree in sorted(trees.items()) for path, leaf in sorted(tree.items())]


def _references(trees: dict[str, Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for path, leaf in _flat(trees):
        try:
            out.append((path, weakref.ref(leaf)))
        except TypeError:  # an int, a float, None: compared by value
            out.append((path, leaf))
    return out
