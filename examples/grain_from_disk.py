"""Train from `.npy` files on disk through a Grain pipeline: workers, augmentation, exact resume.

The digits are written to a folder as ``x.npy`` and ``y.npy`` (your own data would already be there).
``NpySource`` reads each record from disk when it is asked for, so the files may be far larger than
memory; ``GrainPipeline`` shuffles every pass, normalises and randomly shifts each example in two worker
processes, and hands the trainer batches of 64. The run stops after 30 steps and a new trainer resumes
from the checkpoint: the pipeline's position is in it, so the resumed run ends with exactly the
parameters of an uninterrupted one.

Run: ``python examples/grain_from_disk.py``  (needs ``pip install -e ".[examples,grain]"``)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import grain
import jax
import numpy as np
import optax
from flax import linen as nn
from sklearn.datasets import load_digits

from ember import Events
from ember.data import GrainPipeline, NpySource
from ember.handlers import Checkpoint
from ember.training import TrainState, create_trainer


def normalise(example):
    return {"x": (example["x"] / 16.0).astype(np.float32)[..., None], "y": example["y"]}


class Shift(grain.transforms.RandomMap):
    """Move the image by up to a pixel, filling with zeros."""

    def random_map(self, element, rng):
        dy, dx = rng.integers(-1, 2, size=2)
        x = np.roll(element["x"], (dy, dx), axis=(0, 1))
        if dy:
            x[0 if dy > 0 else -1] = 0
        if dx:
            x[:, 0 if dx > 0 else -1] = 0
        return {"x": x, "y": element["y"]}


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(16, (3, 3))(x))
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        return nn.Dense(10)(x.reshape((x.shape[0], -1)))


def loss_fn(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()


def new_trainer():
    state = TrainState.from_linen(CNN(), np.zeros((1, 8, 8, 1), np.float32), optax.adam(3e-3), seed=0)
    return create_trainer(state, loss_fn)


def main() -> None:
    folder = Path(tempfile.mkdtemp())
    digits = load_digits()
    np.save(folder / "x.npy", digits.images.astype(np.float32))
    np.save(folder / "y.npy", digits.target.astype(np.int32))

    def pipeline():
        return GrainPipeline(
            NpySource(folder), batch_size=64, transforms=[normalise, Shift()], shuffle=True, seed=0, worker_count=2
        )

    straight = new_trainer()
    straight.run(pipeline(), max_epochs=2)

    first = new_trainer()
    Checkpoint({"trainer": first}, folder / "ckpt").attach(first, Events.ITERATION_COMPLETED(every=10))
    first.add_event_handler(Events.ITERATION_COMPLETED(once=30), lambda e: e.terminate())
    first.run(pipeline(), max_epochs=2)  # stops at 30 of 56 steps; the workers stop with it

    resumed = new_trainer()
    info = Checkpoint({"trainer": resumed}, folder / "ckpt").resume()
    resumed.run(pipeline())
    same = all(
        np.array_equal(a, b)
        for a, b in zip(
            jax.tree.leaves(straight.state.train_state), jax.tree.leaves(resumed.state.train_state), strict=True
        )
    )
    print(f"resumed at step {info.step}, finished at {resumed.state.iteration}; identical to straight: {same}")


if __name__ == "__main__":  # worker processes import this file: the run must not start at import
    main()
