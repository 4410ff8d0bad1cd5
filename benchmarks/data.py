"""The step never waits for data: the digits CNN fed by a Grain pipeline with per-example transforms, against memory.

Three ways of feeding one compiled trainer (the digits CNN of ``ember train``: batches of 64, AdamW with a
cosine schedule, a running average of the loss), interleaved, each timed over epochs 2 to E (the first
epoch, with worker start-up and compilation, is left out: this is the steady state a long run lives in):

- ``memory``: an :class:`~ember.data.ArrayDataset` of the prepared arrays, the reference: data costs
  nothing but the batch gather;
- ``grain``: a :class:`~ember.data.GrainPipeline` over the raw records (8x8 images in 0..16, as on disk),
  each example normalised and randomly shifted (a 1-pixel crop of the zero-padded image) and flipped, in
  ``--workers`` worker processes;
- ``grain_inline``: the same pipeline read in the training process (``worker_count=0``), to show what the
  workers take off the step's path.

Run: ``python benchmarks/data.py [--epochs E] [--repeats N] [--workers W] [--smoke]``; results in
``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import grain
import jax
import numpy as np
import optax
from _runs import interleaved

from ember import Events
from ember.cli import load_config
from ember.cli._registry import build_model, build_optimizer, build_schedule, digits_arrays
from ember.data import ArrayDataset, GrainPipeline
from ember.metrics import RunningAverage
from ember.training import TrainState, create_trainer


def normalise(example: dict[str, Any]) -> dict[str, Any]:
    return {"x": (example["image"] / 16.0).astype(np.float32)[..., None], "y": example["y"]}


class ShiftAndFlip(grain.transforms.RandomMap):
    """A random shift by up to a pixel (a crop of the zero-padded image) and a random horizontal flip."""

    def random_map(self, element: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        x, out = element["x"], np.zeros_like(element["x"])
        dy, dx = rng.integers(-1, 2, size=2)
        out[max(-dy, 0) : 8 + min(-dy, 0), max(-dx, 0) : 8 + min(-dx, 0)] = x[
            max(dy, 0) : 8 + min(dy, 0), max(dx, 0) : 8 + min(dx, 0)
        ]
        return {"x": out[:, ::-1] if rng.random() < 0.5 else out, "y": element["y"]}


def loss_fn(model: Any, batch: Any) -> Any:
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="no warm-up run: a check that it runs, not a measure")
    args = parser.parse_args()

    images, labels = digits_arrays()  # ember train's own reading of scikit-learn's digits
    images, labels = images.astype(np.float32), labels.astype(np.int32)
    records = [{"image": im, "y": y} for im, y in zip(images, labels, strict=True)]
    arrays = {"x": (images / 16.0).astype(np.float32)[..., None], "y": labels}

    cfg = load_config({})
    steps = len(labels) // 64
    schedule = build_schedule(cfg.optimizer, args.epochs * steps)
    state = TrainState.from_linen(
        build_model(cfg.model), arrays["x"][:1], build_optimizer(cfg.optimizer, schedule), rngs=("dropout",)
    )
    trainer = create_trainer(state, loss_fn)
    RunningAverage(output_transform=lambda o: o["loss"]).attach(trainer, "loss")
    initial = jax.device_get(trainer.state.train_state)
    marks: list[float] = []

    def mark() -> None:
        jax.block_until_ready(trainer.state.train_state)
        marks.append(time.perf_counter())

    trainer.add_event_handler(Events.EPOCH_COMPLETED(once=1), mark)
    trainer.add_event_handler(Events.COMPLETED, mark)
    waits: list[float] = []  # seconds the step's thread spent in next(data), after the first epoch
    asked = [0.0]

    def ask() -> None:
        asked[0] = time.perf_counter()

    def got(engine: Any) -> None:
        if engine.state.epoch > 1:
            waits.append(time.perf_counter() - asked[0])

    trainer.add_event_handler(Events.GET_BATCH_STARTED, ask)
    trainer.add_event_handler(Events.GET_BATCH_COMPLETED, got)
    waited: dict[str, list[float]] = {}

    def steady(name: str, make: Any) -> Any:
        def run() -> float:
            trainer.state.train_state = trainer.placement.put_state(initial)
            trainer.state.max_epochs = None
            marks.clear()
            waits.clear()
            trainer.run(make(), max_epochs=args.epochs)
            waited.setdefault(name, []).append(sum(waits) / len(waits))
            return (marks[1] - marks[0]) / ((args.epochs - 1) * steps)

        return run

    def pipeline(workers: int) -> Any:
        return lambda: GrainPipeline(
            records, batch_size=64, transforms=[normalise, ShiftAndFlip()], shuffle=True, worker_count=workers
        )

    sides = {
        "memory": steady("memory", lambda: ArrayDataset(arrays, batch_size=64, shuffle=True, drop_remainder=True)),
        "grain": steady("grain", pipeline(args.workers)),
        "grain_inline": steady("grain_inline", pipeline(0)),
    }
    if not args.smoke:
        for side in sides.values():
            side()  # compile, start-up
        waited.clear()  # the warm-up's waits are not measured
    got = interleaved(sides, args.repeats)
    med = {k: statistics.median(v) for k, v in got.items()}
    print(
        f"{jax.devices()[0].device_kind}, {os.cpu_count()} cores, {args.workers} workers, {args.epochs} epochs of "
        f"{steps} steps, {args.repeats} repeats, median:"
    )
    for name, seconds in med.items():
        print(
            f"  {name:13s} {seconds * 1e3:7.3f} ms/step   throughput x{med['memory'] / seconds:.3f} of memory   "
            f"waiting for data {statistics.median(waited[name]) * 1e3:.3f} ms/step"
        )
    print(json.dumps({k: [round(s * 1e6, 1) for s in v] for k, v in got.items()}))


if __name__ == "__main__":
    main()
