"""Flax's own NNX MNIST tutorial, ported: the same CNN, optimizer and metrics, driven by an ember trainer.

The tutorial writes ``train_step``/``eval_step`` with ``nnx.jit``, an ``nnx.Optimizer``, an
``nnx.MultiMetric`` of accuracy and average loss, and a Python loop that evaluates every ``eval_every``
steps. Here the model and its loss function are the tutorial's; ``TrainState.from_nnx`` takes the place of
``nnx.Optimizer``, ember's ``Accuracy`` and ``Average`` (updated inside the compiled step) that of
``nnx.MultiMetric``, and an ``ITERATION_COMPLETED(every=eval_every)`` handler that of the loop's ``if``.
The data is scikit-learn's digits (8x8, so the first dense layer is smaller). At the end the run is
repeated with a stop at step 100 and a resume from its checkpoint, equal to the uninterrupted one.

Run: ``python examples/flax_nnx_mnist.py``  (needs ``pip install -e ".[examples]"``)
"""

from __future__ import annotations

import tempfile
from functools import partial
from pathlib import Path

import jax
import numpy as np
import optax
from flax import nnx
from sklearn.datasets import load_digits

from ember import Events
from ember.data import ArrayDataset
from ember.handlers import Checkpoint
from ember.metrics import Accuracy, Average, MetricUsage
from ember.training import TrainState, create_evaluator, create_trainer

train_steps, eval_every, batch_size = 300, 100, 32
learning_rate, momentum = 0.005, 0.9


class CNN(nnx.Module):
    """The tutorial's CNN, for 8x8 images."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
        self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(2 * 2 * 64, 256, rngs=rngs)  # 3136 = 7 * 7 * 64 for 28x28 images
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x):
        x = self.avg_pool(nnx.relu(self.conv1(x)))
        x = self.avg_pool(nnx.relu(self.conv2(x)))
        x = x.reshape(x.shape[0], -1)  # flatten
        x = nnx.relu(self.linear1(x))
        return self.linear2(x)


def loss_fn(model, batch):  # the tutorial's, returning the logits for the metrics beside the loss
    logits = model(batch["image"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=batch["label"]).mean()
    return loss, {"logits": logits, "label": batch["label"]}


def eval_fn(model, batch):  # the tutorial's eval_step: what the metrics read
    loss, out = loss_fn(model, batch)
    return {**out, "loss": loss}


def datasets():
    digits = load_digits()
    images, labels = (digits.images / 16.0).astype(np.float32)[..., None], digits.target.astype(np.int32)
    train = ArrayDataset(
        {"image": images[:1400], "label": labels[:1400]}, batch_size, shuffle=True, drop_remainder=True
    )
    test = ArrayDataset({"image": images[1400:], "label": labels[1400:]}, batch_size=len(labels) - 1400)
    return train, test


#: the tutorial resets its metrics after each evaluation: over each window of `eval_every` steps
WINDOW = MetricUsage(
    "window",
    reset=Events.ITERATION_STARTED(event_filter=lambda _, i: (i - 1) % eval_every == 0),
    update=Events.ITERATION_COMPLETED,
    compute=Events.ITERATION_COMPLETED(every=eval_every),
)


def attach_metrics(engine, usage="epoch_wise"):  # nnx.MultiMetric(accuracy=Accuracy(), loss=Average("loss"))
    Accuracy(output_transform=lambda out: (out["logits"], out["label"])).attach(engine, "accuracy", usage=usage)
    Average(key="loss").attach(engine, "loss", usage=usage)


def run(checkpoints=None, stop_at=None):
    train_ds, test_ds = datasets()
    state = TrainState.from_nnx(CNN(rngs=nnx.Rngs(0)), optax.adamw(learning_rate, momentum))  # nnx.Optimizer
    trainer = create_trainer(state, loss_fn)
    evaluator = create_evaluator(trainer, eval_fn)
    attach_metrics(trainer, WINDOW)
    attach_metrics(evaluator)
    metrics_history = {"train_loss": [], "train_accuracy": [], "test_loss": [], "test_accuracy": []}

    @trainer.on(Events.ITERATION_COMPLETED(every=eval_every))
    def evaluate(engine):  # the tutorial's `if step % eval_every == 0` block
        for metric in ("loss", "accuracy"):
            metrics_history[f"train_{metric}"].append(float(engine.state.metrics[metric]))
        for metric, value in evaluator.run(test_ds).metrics.items():
            metrics_history[f"test_{metric}"].append(float(value))
        print(
            f"[train] step: {engine.state.iteration}, loss: {metrics_history['train_loss'][-1]:.4f}, "
            f"accuracy: {metrics_history['train_accuracy'][-1] * 100:.2f}"
        )
        print(
            f"[test] step: {engine.state.iteration}, loss: {metrics_history['test_loss'][-1]:.4f}, "
            f"accuracy: {metrics_history['test_accuracy'][-1] * 100:.2f}"
        )

    if checkpoints is not None:
        saver = Checkpoint({"trainer": trainer}, checkpoints, n_saved=1)
        saver.attach(trainer, Events.ITERATION_COMPLETED(every=eval_every))
        if stop_at is not None:
            trainer.add_event_handler(Events.ITERATION_COMPLETED(once=stop_at), lambda e: e.terminate())
        saver.resume()
    trainer.run(train_ds, max_iters=train_steps)
    return trainer, metrics_history


if __name__ == "__main__":
    straight, history = run()
    folder = Path(tempfile.mkdtemp())
    run(checkpoints=folder, stop_at=100)
    resumed, _ = run(checkpoints=folder)
    same = all(
        np.array_equal(a, b)
        for a, b in zip(
            jax.tree.leaves(straight.state.train_state), jax.tree.leaves(resumed.state.train_state), strict=True
        )
    )
    print(f"test accuracy {history['test_accuracy'][-1] * 100:.1f}%; resumed run identical: {same}")
