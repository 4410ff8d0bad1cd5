"""What the benchmarks share: timing a whole run of an ember trainer, restarted from the same state."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax


def timed_runs(trainer: Any, initial: Any) -> Callable[[Any], float]:
    """``run(data) -> seconds``: a fresh run of ``trainer`` over ``data``, each from the host state ``initial``.

    The train state is put back on the device before the clock starts, and the clock stops when the last
    step's state is ready (and, with a ``Checkpoint`` attached, the last save is on disk).
    """

    def run(data: Any) -> float:
        trainer.state.train_state = trainer.placement.put_state(initial)
        trainer.state.max_epochs = None  # a fresh run each time
        jax.block_until_ready(trainer.state.train_state)
        start = time.perf_counter()
        trainer.run(data)
        jax.block_until_ready(trainer.state.train_state)
        return time.perf_counter() - start

    return run
