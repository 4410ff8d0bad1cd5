"""Prefetch against batch size: where putting batches on device ahead pays, in one process.

An MLP ``D-512-10`` with Adam trains on synthetic float32 batches of growing size, with ``prefetch=0``
(each NumPy batch handed to the compiled call, which transfers it), ``prefetch=2`` (``jax.device_put``
two batches ahead) and ``prefetch=None`` (the default: 2 on an accelerator from
``PREFETCH_MIN_BYTES`` of host data per call, else 0). Each row is the best of ``--repeats`` runs, in
microseconds per step; ``p2/p0`` is how much faster prefetching is, ``auto/best`` how close the default
comes to the better of the two. On a CPU backend the default never prefetches.

Run: ``python benchmarks/prefetch.py [--repeats R] [--quick]``.
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
from _runs import timed_runs
from flax import linen as nn

from ember.training import SingleDevice, TrainState, create_trainer

# (rows, features, steps, steps_per_call): host bytes per call from 0.1 MB to 50 MB
CASES = [
    (32, 784, 600, 1),
    (256, 784, 400, 1),
    (400, 784, 400, 1),
    (640, 784, 300, 1),
    (1024, 784, 200, 1),
    (1024, 3072, 100, 1),
    (4096, 3072, 40, 1),
    (32, 784, 600, 10),
    (128, 784, 400, 10),
]
QUICK = [(32, 784, 20, 1), (64, 784, 20, 2)]


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(10)(nn.relu(nn.Dense(512)(x)))


def loss_fn(model: Any, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    x, y = batch
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def runner(initial: TrainState, data: list[Any], prefetch: int | None, k: int) -> Callable[[], float]:
    trainer = create_trainer(initial, loss_fn, placement=SingleDevice(), prefetch=prefetch, steps_per_call=k)
    run = timed_runs(trainer, initial)
    return lambda: run(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="two tiny cases: a smoke run, not a measurement")
    args = parser.parse_args()
    dev = jax.devices()[0]
    print(f"python {platform.python_version()}, jax {jax.__version__} on {dev.platform} ({dev.device_kind})")
    rng = np.random.default_rng(0)
    for rows, width, steps, k in QUICK if args.quick else CASES:
        data = [
            (rng.normal(size=(rows, width)).astype(np.float32), rng.integers(0, 10, rows).astype(np.int32))
            for _ in range(steps)
        ]
        initial = jax.device_get(TrainState.from_linen(MLP(), jnp.ones((1, width)), optax.adam(1e-3), seed=0))
        runs = {p: runner(initial, data, p, k) for p in (0, 2, None)}
        for run in runs.values():
            run()  # compile and warm up
        best = {p: min(run() for _ in range(args.repeats)) for p, run in runs.items()}
        per_call = (data[0][0].nbytes + data[0][1].nbytes) * k / 1e6
        us = {p: 1e6 * t / steps for p, t in best.items()}
        print(
            f"  {rows:5d} x {width} rows, K={k:2d}: {per_call:6.2f} MB per call | prefetch=0 {us[0]:8.1f} us/step, "
            f"=2 {us[2]:8.1f}, =None {us[None]:8.1f} | p2/p0 {us[0] / us[2]:.2f}, "
            f"auto/best {min(us[0], us[2]) / us[None]:.2f}"
        )


if __name__ == "__main__":
    main()
