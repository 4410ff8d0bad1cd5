"""Decisions every process of a multi-process run takes together."""

from __future__ import annotations

import numpy as np


def any_process(flag: bool) -> bool:
    """Whether ``flag`` is true on any process: the same answer on every process.

    In a multi-process run this is a collective, so every process must call it at the same point; in a
    single process it is a plain ``bool``.

    Handlers whose decision changes control flow (stop, save) use it, so no process skips a collective
    the others enter.

    Examples:
        >>> from ember.handlers._agreement import any_process
        >>> any_process(False), any_process(True)
        (False, True)
    """
    import jax

    if jax.process_count() == 1:
        return bool(flag)
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(np.asarray(flag, np.bool_))).any())
