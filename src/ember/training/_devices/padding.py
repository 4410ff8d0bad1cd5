"""Evaluation batches that do not split over the devices: padded, with a mask of the real examples."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ember.data import Mapped, Masked


def pad_batch(batch: Any, n: int) -> tuple[Any, np.ndarray] | None:
    """``(padded, mask)`` when ``batch``'s leading axis does not divide by ``n``, else ``None``.

    The batch is padded with copies of its last example (so labels stay valid values), up to the next
    multiple of ``n``; ``mask`` is ``True`` for the real examples.

    Examples:
        >>> import numpy as np
        >>> from ember.training._devices.padding import pad_batch
        >>> padded, mask = pad_batch({"x": np.arange(3)}, 2)
        >>> padded["x"].tolist(), mask.tolist()
        ([0, 1, 2, 2], [True, True, True, False])
        >>> pad_batch({"x": np.arange(4)}, 2) is None
        True
    """
    leaves = jax.tree.leaves(batch)
    size = int(np.shape(leaves[0])[0]) if leaves and np.ndim(leaves[0]) else 0
    if size == 0 or size % n == 0:
        return None
    extra = n - size % n

    def pad(x: Any) -> Any:
        lib = np if isinstance(x, np.ndarray) else jnp
        return lib.concatenate([x, lib.repeat(x[-1:], extra, axis=0)])

    return jax.tree.map(pad, batch), np.arange(size + extra) < size


class PaddedBatches:
    """Iterates ``source``, padding each batch that does not split over ``n`` devices into ``(batch, mask)``.

    A [`Masked`][ember.data.Masked] batch (a process's part of an evaluation batch, padded by the data) comes out as
    ``(batch, mask)`` too, padded further where it does not split over ``n``.

    `padded` says, batch by batch in order, whether it was padded (read it as the batches are
    used; device prefetch may have read some ahead).
    """

    def __init__(self, source: Iterable[Any], n: int) -> None:
        self.source, self.n = source, n
        self.padded: collections.deque[bool] = collections.deque()

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]  # raises TypeError for unsized sources, as len() should

    def __iter__(self) -> Iterator[Any]:
        self.padded.clear()
        return Mapped(iter(self.source), self._pad)

    def _pad(self, batch: Any) -> Any:
        if isinstance(batch, Masked):  # padded by the data already (this process's part of an evaluation batch)
            examples, mask = batch
            done = pad_batch(examples, self.n)
            if done is not None:
                examples, mask = done[0], np.concatenate([np.asarray(mask), np.zeros(len(done[1]) - len(mask), bool)])
            self.padded.append(True)
            return examples, np.asarray(mask)
        done = pad_batch(batch, self.n)
        self.padded.append(done is not None)
        return batch if done is None else done


def with_mask(output: Any, mask: Any, n: int) -> Any:
    """``output`` with ``mask`` (real examples) under ``"mask"``, combined with a mask it already has."""
    if not isinstance(output, Mapping):
        kind = "an array" if hasattr(output, "shape") else f"a {type(output).__name__}"
        raise TypeError(
            f"A batch was padded to split over {n} devices, so the evaluator's output must be a dict, to carry "
            f'the mask of the real examples under "mask"; got {kind}. Return a dict, or use an '
            f"evaluation batch size divisible by {n}."
        )
    own = output.get("mask")
    return {**output, "mask": mask if own is None else jnp.logical_and(own, mask)}


def merge_device_axis(output: Any) -> Any:
    """A pmapped evaluator's output, ``(devices, batch/devices, ...)`` per leaf, as ``(batch, ...)``.

    Scalars (unmapped by the placement) stay as they are.
    """
    return jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])) if getattr(x, "ndim", 0) >= 2 else x, output)
