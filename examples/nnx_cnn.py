"""Train a Flax NNX convolutional network (batch norm, dropout) on scikit-learn's handwritten digits.

The NNX module is split into graph definition and state under the hood, so the same compiled step,
placement and checkpointing serve linen and NNX; ``to_nnx()`` gives the trained module back.

Run: ``python examples/nnx_cnn.py``  (needs ``pip install -e ".[examples]"`` for scikit-learn)
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from sklearn.datasets import load_digits

from ember import Engine, Events
from ember.data import ArrayDataset
from ember.training import TrainState, create_evaluator, create_trainer

digits = load_digits()
order = np.random.default_rng(1).permutation(len(digits.target))
images = (digits.images[order] / 16.0).astype(np.float32)[..., None]  # (N, 8, 8, 1)
labels = digits.target[order].astype(np.int32)
train = ArrayDataset({"x": images[:1500], "y": labels[:1500]}, batch_size=50, shuffle=True, drop_remainder=True)
val = ArrayDataset({"x": images[1500:], "y": labels[1500:]}, batch_size=len(labels) - 1500)


class CNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.conv = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
        self.bn = nnx.BatchNorm(32, rngs=rngs)
        self.dropout = nnx.Dropout(0.25, rngs=rngs)
        self.head = nnx.Linear(4 * 4 * 32, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.bn(self.conv(x)))
        x = nnx.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        return self.head(self.dropout(x.reshape((x.shape[0], -1))))


def loss_fn(model, batch):
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


state = TrainState.from_nnx(CNN(nnx.Rngs(0, dropout=1)), optax.adam(3e-3))
trainer = create_trainer(state, loss_fn)
evaluator = create_evaluator(trainer, lambda model, b: jnp.sum(jnp.argmax(model(b["x"]), -1) == b["y"]))


@trainer.on(Events.EPOCH_COMPLETED(every=2))
def validate(engine: Engine) -> None:
    evaluator.run(val)
    accuracy = int(evaluator.state.output) / val.num_examples
    engine.state.metrics["val_accuracy"] = accuracy
    print(f"epoch {engine.state.epoch:2d}  loss {float(engine.state.output['loss']):.4f}  val accuracy {accuracy:.3f}")


if __name__ == "__main__":
    trainer.run(train, max_epochs=8)
    model = trainer.state.train_state.to_nnx()  # the trained NNX module, ready to use
    model.eval()
    print("trained module:", type(model).__name__, "predicts", np.asarray(jnp.argmax(model(images[:5]), -1)))
    assert trainer.state.metrics["val_accuracy"] > 0.93, trainer.state.metrics
