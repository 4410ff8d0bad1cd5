"""`ArrayDataset`: batches from in-memory arrays, seeded shuffling, a resumable position."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import numpy as np


class ArrayDataset:
    """Batches over a pytree of arrays that share their leading axis, shuffled anew each pass.

    Each ``iter()`` starts a pass (epoch), whose order is a permutation seeded by ``(seed, pass)``: the
    same seed gives the same batches, and every pass differs. The pass is the one given to
    :meth:`set_epoch` (engines call it with a count of their own, so a trainer's order does not depend on
    an evaluator iterating the same data), else the one after the last pass handed out. The position
    (the pass and the batches of it handed out, by whichever iterator handed out the latest batch)
    round-trips through :meth:`state_dict`, so an engine resumed from a checkpoint sees exactly the
    batches an uninterrupted run would.

    Args:
        arrays: a pytree (dict, tuple, array) of arrays with the same length on axis 0.
        batch_size: examples per batch.
        shuffle: permute the examples each pass.
        seed: the shuffling seed.
        drop_remainder: drop the last batch when it is short.
        shard: ``(index, count)``: yield only part ``index`` of ``count`` equal parts of every batch, so
            ``count`` processes together see the same global batches as one process would.
            ``batch_size`` stays the global batch size (divisible by ``count``; ``drop_remainder`` is
            required). The default, ``"auto"``, is ``(jax.process_index(), jax.process_count())``: the
            whole batch in a single-process run, this process's part in a multi-process one.

    Examples:
        >>> import numpy as np
        >>> from ember.data import ArrayDataset
        >>> data = ArrayDataset({"x": np.arange(10)}, batch_size=4, drop_remainder=True)
        >>> len(data), [b["x"].tolist() for b in data]
        (2, [[0, 1, 2, 3], [4, 5, 6, 7]])
    """

    def __init__(
        self,
        arrays: Any,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_remainder: bool = False,
        shard: tuple[int, int] | str = "auto",
    ) -> None:
        leaves = jax.tree.leaves(arrays)
        if not leaves:
            raise ValueError("`arrays` holds no arrays; pass a pytree of arrays such as {'x': x, 'y': y}.")
        if any(np.ndim(x) == 0 for x in leaves):
            raise ValueError(
                "Every leaf of `arrays` must be an array with a leading (example) axis; got a scalar leaf. "
                "Pass np.asarray(values) rather than a Python list of numbers."
            )
        lengths = {int(np.shape(x)[0]) for x in leaves}
        if len(lengths) != 1:
            raise ValueError(f"All arrays must share their leading axis length; got lengths {sorted(lengths)}.")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"`batch_size` must be a positive int, got {batch_size!r}.")
        self.arrays = jax.tree.map(np.asarray, arrays)
        self.num_examples = lengths.pop()
        if self.num_examples == 0:
            raise ValueError("`arrays` hold 0 examples; an empty dataset has no batches to train on.")
        if drop_remainder and batch_size > self.num_examples:
            raise ValueError(
                f"`batch_size`={batch_size} exceeds the {self.num_examples} examples and drop_remainder=True "
                "would leave no batch."
            )
        if shard == "auto":
            shard = (jax.process_index(), jax.process_count())
        if (
            not isinstance(shard, tuple)
            or len(shard) != 2
            or not all(isinstance(v, int) for v in shard)
            or not 0 <= shard[0] < shard[1]
        ):
            raise ValueError(f'`shard` must be "auto" or (index, count) with 0 <= index < count, got {shard!r}.')
        if shard[1] > 1 and (batch_size % shard[1] or not drop_remainder):
            raise ValueError(
                f"With `shard`={shard}, `batch_size` (the global batch, {batch_size}) must divide by {shard[1]} "
                "and `drop_remainder` must be True, so every process gets an equal part of every batch."
            )
        self.shard = shard
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_remainder = drop_remainder
        self._epoch = -1  # the pass in progress, -1 before the first
        self._pos = 0  # batches handed out in that pass
        self._pending: tuple[int, int] | None = None
        self._next_epoch: int | None = None

    def __len__(self) -> int:
        full, rest = divmod(self.num_examples, self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_examples)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)

    def __iter__(self) -> Iterator[Any]:
        if self._pending is not None:
            epoch, start = self._pending
        elif self._next_epoch is not None:
            epoch, start = self._next_epoch, 0
        else:
            epoch, start = self._epoch + 1, 0
        self._pending = self._next_epoch = None
        self._epoch, self._pos = epoch, start
        return _Pass(self, epoch, start)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` start pass ``epoch`` from its first batch (torch's ``sampler.set_epoch``).

        Examples:
            >>> import numpy as np
            >>> from ember.data import ArrayDataset
            >>> data = ArrayDataset(np.arange(4), batch_size=4, shuffle=True, seed=0)
            >>> first = [b.tolist() for b in data]
            >>> _ = list(data)  # pass 1
            >>> data.set_epoch(0)
            >>> [b.tolist() for b in data] == first
            True
        """
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"`epoch` must be a non-negative int, got {epoch!r}.")
        self._next_epoch = epoch

    def _batch(self, epoch: int, b: int, order: np.ndarray) -> Any:
        index, count = self.shard
        part = self.batch_size // count
        idx = order[b * self.batch_size : (b + 1) * self.batch_size][index * part : (index + 1) * part]
        self._epoch, self._pos = epoch, b + 1  # the dataset's position: that of the latest batch handed out
        return jax.tree.map(lambda a: a[idx], self.arrays)

    def state_dict(self) -> dict[str, int]:
        """The position: the pass of the latest batch handed out, and how many of that pass's batches were.

        Each iterator also reports its own position (``iter(data).state_dict()``), which engines save, so
        two engines iterating one dataset each resume where they were.

        Examples:
            >>> import numpy as np
            >>> from ember.data import ArrayDataset
            >>> data = ArrayDataset(np.arange(6), batch_size=2, shuffle=True, seed=1)
            >>> it = iter(data); _ = next(it)
            >>> data.state_dict()
            {'epoch': 0, 'position': 1}
        """
        return {"epoch": self._epoch, "position": self._pos}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Make the next ``iter()`` continue from a saved position.

        Examples:
            >>> import numpy as np
            >>> from ember.data import ArrayDataset
            >>> data = ArrayDataset(np.arange(6), batch_size=2)
            >>> data.load_state_dict({"epoch": 0, "position": 2})
            >>> [b.tolist() for b in data]
            [[4, 5]]
        """
        try:
            epoch, pos = int(state_dict["epoch"]), int(state_dict["position"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"`state_dict` must hold int 'epoch' and 'position', got {state_dict!r}.") from None
        if not 0 <= pos <= len(self):
            raise ValueError(f"`state_dict` position {pos} is outside this dataset's {len(self)} batches per pass.")
        self._epoch, self._pos = epoch, pos
        self._pending, self._next_epoch = (epoch, pos), None

    def __repr__(self) -> str:
        return (
            f"ArrayDataset({self.num_examples} examples, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"seed={self.seed}, drop_remainder={self.drop_remainder})"
        )


class _Pass(Iterator[Any]):
    """One pass over an :class:`ArrayDataset`, from batch ``start``; it knows its own position."""

    def __init__(self, data: ArrayDataset, epoch: int, start: int) -> None:
        self._data, self._epoch, self._pos = data, epoch, start
        self._order = data._order(epoch)

    def __next__(self) -> Any:
        if self._pos >= len(self._data):
            raise StopIteration
        batch = self._data._batch(self._epoch, self._pos, self._order)
        self._pos += 1
        return batch

    def state_dict(self) -> dict[str, int]:
        """This pass's position: ``{"epoch": pass, "position": batches handed out}``."""
        return {"epoch": self._epoch, "position": self._pos}
