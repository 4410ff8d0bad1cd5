"""`ArrayDataset`: batches from in-memory arrays, seeded shuffling, a resumable position."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from ember.data._masked import Masked


class ArrayDataset:
    """Batches over a pytree of arrays that share their leading axis, shuffled anew each pass.

    Each ``iter()`` starts a pass (epoch), whose order is a permutation seeded by ``(seed, pass)``: the same seed gives
    the same batches, and every pass differs. The pass is the one given to
    [`set_epoch`][ember.data.ArrayDataset.set_epoch] (engines call it with a count of their own, so a trainer's order
    does not depend on an evaluator iterating the same data), else the one after the last pass started. Each iterator's
    position (its pass and the batches of it handed out) round-trips through its ``get_state()`` / ``set_state()``,
    Grain's protocol, so an engine resumed from a checkpoint sees exactly the batches an uninterrupted run would.

    Args:
        arrays: a pytree (dict, tuple, array) of arrays with the same length on axis 0.
        batch_size: examples per batch.
        shuffle: permute the examples each pass.
        seed: the shuffling seed.
        drop_remainder: drop the last batch when it is short.
        shard: ``(index, count)``: yield only part ``index`` of ``count`` parts of every batch, so
            ``count`` processes together see the same global batches as one process would.
            ``batch_size`` stays the global batch size. With ``drop_remainder=True`` (training) it must divide
            by ``count``, and every part is an equal slice. With ``drop_remainder=False`` (an evaluation set,
            which must see every example) each batch is split as evenly as it goes and every process gets a
            [`Masked`][ember.data.Masked] part of one size, the short ones padded: an evaluator counts only the
            real examples. The default, ``"auto"``, is ``(jax.process_index(), jax.process_count())``: the
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
        if shard[1] > 1 and drop_remainder and batch_size % shard[1]:
            raise ValueError(
                f"With `shard`={shard} and drop_remainder=True (training), `batch_size` (the global batch, "
                f"{batch_size}) must divide by {shard[1]}, so every process gets an equal part of every batch; use a "
                f"multiple of {shard[1]}. An evaluation set (drop_remainder=False) splits any batch, masked."
            )
        self.shard = shard
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_remainder = drop_remainder
        self._epoch = -1  # the latest pass started, -1 before the first
        self._next_epoch: int | None = None

    def __len__(self) -> int:
        full, rest = divmod(self.num_examples, self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_examples)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)

    def __iter__(self) -> Iterator[Any]:
        epoch = self._next_epoch if self._next_epoch is not None else self._epoch + 1
        self._next_epoch, self._epoch = None, epoch
        return _Pass(self, epoch)

    def peek(self) -> Any:
        """The first batch of the next pass, without starting it: the pass counter and any position stay as they are.

        Examples:
            >>> import numpy as np
            >>> from ember.data import ArrayDataset
            >>> data = ArrayDataset(np.arange(6), batch_size=4, shuffle=True, seed=0)
            >>> first = data.peek()
            >>> first.tolist() == next(iter(data)).tolist()
            True
        """
        epoch = self._next_epoch if self._next_epoch is not None else self._epoch + 1
        return self._batch(0, self._order(epoch))

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

    def _batch(self, b: int, order: np.ndarray) -> Any:
        index, count = self.shard
        examples = order[b * self.batch_size : (b + 1) * self.batch_size]
        if count == 1 or self.drop_remainder:
            part = self.batch_size // count
            idx = examples[index * part : (index + 1) * part]
            return jax.tree.map(lambda a: a[idx], self.arrays)
        part = -(-len(examples) // count)  # every process's part has this size; the last ones may be short
        mine = examples[index * part : (index + 1) * part]
        padded = np.concatenate([mine, np.full(part - len(mine), mine[-1] if len(mine) else examples[-1])])
        mask = np.arange(part) < len(mine)
        return Masked(jax.tree.map(lambda a: a[padded], self.arrays), mask)

    def _identity(self) -> dict[str, Any]:
        """What a saved position must match: the same examples, batched and shuffled the same way."""
        return {
            "examples": self.num_examples,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
        }

    def __repr__(self) -> str:
        return (
            f"ArrayDataset({self.num_examples} examples, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"seed={self.seed}, drop_remainder={self.drop_remainder})"
        )


class _Pass(Iterator[Any]):
    """One pass over an ``ArrayDataset``; its position round-trips through ``get_state``/``set_state``."""

    def __init__(self, data: ArrayDataset, epoch: int) -> None:
        self._data, self._epoch, self._pos = data, epoch, 0
        self._order = data._order(epoch)

    def __next__(self) -> Any:
        if self._pos >= len(self._data):
            raise StopIteration
        batch = self._data._batch(self._pos, self._order)
        self._pos += 1
        return batch

    def get_state(self) -> dict[str, Any]:
        """This pass's position, ``{"epoch": pass, "position": batches handed out}``, and the data it is for.

        Examples:
            >>> import numpy as np
            >>> from ember.data import ArrayDataset
            >>> it = iter(ArrayDataset(np.arange(6), batch_size=2)); _ = next(it)
            >>> it.get_state()
            {'epoch': 0, 'position': 1, 'examples': 6, 'batch_size': 2, 'shuffle': False, 'seed': 0}
        """
        return {"epoch": self._epoch, "position": self._pos, **self._data._identity()}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from a position saved by `get_state`, on the same data.

        Raises:
            ValueError: ``state`` is not such a position, or was saved for other data (another number of
                examples, batch size, shuffling or seed).

        Examples:
            >>> import numpy as np
            >>> from ember.data import ArrayDataset
            >>> data = ArrayDataset(np.arange(6), batch_size=2)
            >>> it = iter(data)
            >>> it.set_state({"epoch": 0, "position": 2, "examples": 6, "batch_size": 2, "shuffle": False, "seed": 0})
            >>> [b.tolist() for b in it]
            [[4, 5]]
        """
        try:
            epoch, pos = int(state["epoch"]), int(state["position"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"`state` must hold int 'epoch' and 'position', got {state!r}.") from None
        own = self._data._identity()
        saved = {k: state.get(k) for k in own}
        if saved != own:
            differs = ", ".join(f"{k} {saved[k]!r} (now {own[k]!r})" for k in own if saved[k] != own[k])
            raise ValueError(
                f"The saved position is for other data: {differs}. Resume with the data the run was saved "
                "with, or start the run anew."
            )
        if not 0 <= pos <= len(self._data) or epoch < 0:
            raise ValueError(f"`state` position {pos} is outside this dataset's {len(self._data)} batches per pass.")
        self._epoch, self._pos, self._order = epoch, pos, self._data._order(epoch)
