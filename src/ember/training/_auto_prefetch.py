"""`auto_prefetch`: how many batches ``prefetch=None`` puts on device ahead, judged by a pass's first batch."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ember.training._devices.placement import Placement

#: A call's batch must hold at least this many host bytes for ``prefetch=None`` to put batches on device
#: ahead (on an accelerator): below it ``jax.device_put`` from Python costs more than it hides (measured in
#: docs/benchmarks.md, "Prefetch against batch size").
PREFETCH_MIN_BYTES = 3 << 19  # 1.5 MiB


def auto_prefetch(batch: Any, placement: Placement) -> int:
    """How many batches ``prefetch=None`` keeps in flight, judged by the first (host) batch of a pass.

    Examples:
        >>> import numpy as np
        >>> from ember.training import SingleDevice
        >>> from ember.training._auto_prefetch import auto_prefetch
        >>> auto_prefetch(np.zeros((8, 4)), SingleDevice())  # small, and a CPU backend here: no prefetch
        0
    """
    if not placement.prefers_prefetch:
        return 0
    host_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(batch) if not isinstance(x, jax.Array))
    return 2 if host_bytes >= PREFETCH_MIN_BYTES else 0
