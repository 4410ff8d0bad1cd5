"""Train a Flax linen convolutional network (batch norm, dropout) on scikit-learn's handwritten digits.

The linen twin of ``nnx_cnn.py``: the module's ``params`` are trained, its ``batch_stats`` are updated by
the step, and dropout draws from a per-step RNG stream (``rngs=("dropout",)``). Validation accuracy
comes from an ``Accuracy`` metric on the evaluator, computed on device and read once per evaluation.

Run: ``python examples/linen_cnn.py``  (needs ``pip install -e ".[examples]"`` for scikit-learn)
"""

from __future__ import annotations

import numpy as np
import optax
from flax import linen as nn
from sklearn.datasets import load_digits

from ember import Engine, Events
from ember.data import ArrayDataset
from ember.metrics import Accuracy
from ember.training import TrainState, create_evaluator, create_trainer

digits = load_digits()
order = np.random.default_rng(1).permutation(len(digits.target))
images = (digits.images[order] / 16.0).astype(np.float32)[..., None]  # (N, 8, 8, 1)
labels = digits.target[order].astype(np.int32)
train = ArrayDataset({"x": images[:1500], "y": labels[:1500]}, batch_size=50, shuffle=True, drop_remainder=True)
val = ArrayDataset({"x": images[1500:], "y": labels[1500:]}, batch_size=len(labels) - 1500)


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Conv(32, (3, 3))(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train)(x))
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        x = nn.Dropout(0.25, deterministic=not train)(x.reshape((x.shape[0], -1)))
        return nn.Dense(10)(x)


def loss_fn(model, batch):
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


state = TrainState.from_linen(CNN(), images[:1], optax.adam(3e-3), seed=0, rngs=("dropout",))
trainer = create_trainer(state, loss_fn)
evaluator = create_evaluator(trainer, lambda model, b: {"y_pred": model(b["x"]), "y": b["y"]})
Accuracy().attach(evaluator, "accuracy")


@trainer.on(Events.EPOCH_COMPLETED(every=2))
def validate(engine: Engine) -> None:
    evaluator.run(val)
    engine.state.metrics["val_accuracy"] = evaluator.state.metrics["accuracy"]
    print(f"epoch {engine.state.epoch:2d}  val accuracy {engine.state.metrics['val_accuracy']:.3f}")


if __name__ == "__main__":
    trainer.run(train, max_epochs=8)
    stats = trainer.state.train_state.model_state["batch_stats"]["BatchNorm_0"]["mean"]
    print("batch-norm running mean (first 3 channels):", np.round(np.asarray(stats[:3]), 3))
    assert trainer.state.metrics["val_accuracy"] > 0.93, trainer.state.metrics
