"""What the benchmarks share: the benchmark metric set, timing a whole run, and interleaving the sides."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import jax

from ember.metrics import Accuracy, Average, RunningAverage


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


def attach_metrics(trainer: Any, names: str = "LAR") -> None:
    """Attach the benchmarks' metric set to ``trainer``, or the part ``names`` picks.

    ``Average`` of the loss as ``"loss"`` (L), ``Accuracy`` as ``"accuracy"`` (A) and a ``RunningAverage``
    of the loss as ``"running_loss"`` (R).
    """
    if "L" in names:
        Average(key="loss").attach(trainer, "loss")
    if "A" in names:
        Accuracy().attach(trainer, "accuracy")
    if "R" in names:
        RunningAverage(output_transform=lambda out: out["loss"]).attach(trainer, "running_loss")


T = TypeVar("T")


def interleaved(sides: dict[str, Callable[[], T]], repeats: int, *, warm_up: bool = False) -> dict[str, list[T]]:
    """Each side's measurements over ``repeats`` rounds; the order alternates from one round to the next.

    ``warm_up``: each side runs once first, unrecorded (imports, first compilations of library code).
    """
    if warm_up:
        for side in sides.values():
            side()
    results: dict[str, list[T]] = {name: [] for name in sides}
    for r in range(repeats):
        for name in list(sides) if r % 2 == 0 else list(reversed(sides)):
            results[name].append(sides[name]())
    return results
