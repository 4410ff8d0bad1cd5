"""`Masked`: a batch padded to a fixed size, with a mask of its real examples."""

from __future__ import annotations

from typing import Any, NamedTuple


class Masked(NamedTuple):
    """A batch padded to a fixed size, and ``mask``, ``True`` for its real examples (a pytree: a named pair).

    An evaluation set split over several processes gives each process a part of every batch; the parts must all have
    one size, so a process whose part is short pads it (with copies of an example) and says which examples are real.
    An evaluator takes a ``Masked`` batch as it takes one it padded itself: the mask reaches the metrics under
    ``"mask"``, and the padding counts for nothing. A trainer refuses one.

    Examples:
        >>> import numpy as np
        >>> from ember.data import Masked
        >>> m = Masked({"x": np.array([1, 2, 2])}, np.array([True, True, False]))
        >>> m.batch["x"].tolist(), m.mask.tolist()
        ([1, 2, 2], [True, True, False])
    """

    batch: Any
    mask: Any
