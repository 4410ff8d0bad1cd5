"""Transforms and sources for the Grain tests, in a module of their own: worker processes import it to unpickle them."""

from __future__ import annotations

import grain
import numpy as np


def normalise(example):
    """Per-example normalisation (a plain callable)."""
    return {"x": (example["x"] - 0.5) * 2.0, "y": example["y"]}


class Jitter(grain.transforms.RandomMap):
    """A random augmentation: noise from Grain's per-example generator."""

    def random_map(self, element, rng: np.random.Generator):
        noise = rng.normal(0.0, 0.1, size=element["x"].shape).astype(element["x"].dtype)
        return {"x": element["x"] + noise, "y": element["y"]}


class BadRecord:
    """A source whose record ``bad`` cannot be read."""

    def __init__(self, arrays, bad: int):
        self.arrays, self.bad = arrays, bad

    def __len__(self):
        return len(self.arrays["y"])

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"checksum mismatch in record {i}")
        return {k: v[i] for k, v in self.arrays.items()}

    def __repr__(self):
        return f"BadRecord(bad={self.bad})"
