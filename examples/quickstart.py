"""Quickstart: a Flax CNN on scikit-learn's handwritten digits, validated every epoch (the Quickstart page's program).

docs/quickstart.md shows this program and what it prints; a test holds the two the same.

Run: ``python examples/quickstart.py``
"""

import optax
from flax import linen as nn
from sklearn.datasets import load_digits

from ember import Events
from ember.data import ArrayDataset
from ember.metrics import Accuracy
from ember.training import create_supervised_evaluator, create_supervised_trainer

digits = load_digits()  # 1,797 8x8 images, shipped with scikit-learn
x, y = (digits.images[..., None] / 16).astype("float32"), digits.target.astype("int32")
train = ArrayDataset((x[:1500], y[:1500]), batch_size=64, shuffle=True)
val = ArrayDataset((x[1500:], y[1500:]), batch_size=297)


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.avg_pool(nn.relu(nn.Conv(16, (3, 3))(x)), (2, 2), strides=(2, 2))
        return nn.Dense(10)(x.reshape((x.shape[0], -1)))


def loss_fn(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


trainer = create_supervised_trainer(CNN(), optax.adam(1e-2), loss_fn)
evaluator = create_supervised_evaluator(trainer, metrics={"accuracy": Accuracy()})


@trainer.on(Events.EPOCH_COMPLETED)
def validate(engine):
    accuracy = evaluator.run(val).metrics["accuracy"]
    loss = float(engine.state.output["loss"])
    print(f"epoch {engine.state.epoch}  loss {loss:.3f}  val accuracy {accuracy:.3f}")


trainer.run(train, max_epochs=5)
