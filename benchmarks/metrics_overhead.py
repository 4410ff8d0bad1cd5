"""Metrics overhead: microseconds per step that fused metrics add to a trainer, on a step that costs ~nothing.

The step multiplies a 4 x 3 batch by 3 parameters, so what a run measures is the engine, the dispatch
of the compiled call and what the metrics add to both: the absolute cost per step that a model's own
step time then hides (or, on a small model and a fast accelerator, does not). Each row is a trainer
whose step returns ``{"loss", "y_pred", "y"}``; the reference attaches nothing, the others attach
``Average`` of the loss, ``Accuracy``, a ``RunningAverage`` of the loss, or all three (what
``benchmarks/throughput.py``'s "ember + metrics" row attaches). Rows run interleaved, the order
reversed every other repeat; the table shows the best and the median run and each one's excess over
the reference's.

Run: ``python benchmarks/metrics_overhead.py [--steps N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _runs import attach_metrics, timed_runs

from ember.training import SingleDevice, TrainState, create_trainer


def loss_fn(model: Any, batch: tuple[jax.Array, jax.Array]) -> Any:
    x, y = batch
    logits = model(x)
    return jnp.mean(logits), {"y_pred": logits, "y": y}


def trainer_run(names: str, data: list[Any]) -> Callable[[], float]:
    """A timed run of a trainer with the metrics ``names`` picks: L(oss), A(ccuracy), R(unning average)."""
    state = TrainState.create(lambda p, x: x * p, jnp.ones(3), optax.sgd(0.0))
    initial = jax.device_get(state)
    trainer = create_trainer(state, loss_fn, placement=SingleDevice())
    attach_metrics(trainer, names)
    run = timed_runs(trainer, initial)
    return lambda: run(data)


ROWS = {
    "no metrics (outputs only)": "",
    "Average of the loss": "L",
    "Accuracy": "A",
    "RunningAverage of the loss": "R",
    "all three": "LAR",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print(f"python {platform.python_version()}, jax {jax.__version__} on {jax.devices()[0]}")
    rng = np.random.default_rng(0)
    batch = (rng.normal(size=(4, 3)).astype(np.float32), rng.integers(0, 3, size=4).astype(np.int32))
    data = [batch] * args.steps
    runs = {label: trainer_run(names, data) for label, names in ROWS.items()}
    for fn in runs.values():
        fn()  # compile and warm up
    times: dict[str, list[float]] = {label: [] for label in runs}
    for i in range(args.repeats):
        for label in list(runs) if i % 2 == 0 else list(runs)[::-1]:
            times[label].append(runs[label]())

    def per_step(t: list[float]) -> tuple[float, float]:
        ordered = sorted(t)
        return 1e6 * ordered[0] / args.steps, 1e6 * ordered[len(ordered) // 2] / args.steps

    ref_best, ref_median = per_step(times["no metrics (outputs only)"])
    print(f"{args.steps} steps, {args.repeats} repeats; microseconds per step (best, median) and the excess")
    for label, t in times.items():
        best, median = per_step(t)
        excess = f"(+{best - ref_best:4.1f})   median {median:6.1f} (+{median - ref_median:4.1f})"
        print(f"  {label:<28} best {best:6.1f} {excess}")


if __name__ == "__main__":
    main()
