"""Train a Flax linen MLP on scikit-learn's handwritten digits, validating every epoch.

The trainer runs a compiled step; the only host reads are one accuracy per epoch and the loss every
100 iterations, in handlers whose filters fired. Runs in seconds on a CPU.

Run: ``python examples/linen_mlp.py``  (needs ``pip install -e ".[examples]"`` for scikit-learn)
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from sklearn.datasets import load_digits

from ember import Engine, Events
from ember.data import ArrayDataset
from ember.training import TrainState, create_evaluator, create_trainer

digits = load_digits()  # 1,797 real 8x8 images shipped inside scikit-learn
order = np.random.default_rng(0).permutation(len(digits.target))
x = (digits.data[order] / 16.0).astype(np.float32)
y = digits.target[order].astype(np.int32)
train = ArrayDataset({"x": x[:1500], "y": y[:1500]}, batch_size=50, shuffle=True, seed=0, drop_remainder=True)
val = ArrayDataset({"x": x[1500:], "y": y[1500:]}, batch_size=len(y) - 1500)


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.relu(nn.Dense(128)(x))
        x = nn.Dropout(0.2, deterministic=not train)(x)
        return nn.Dense(10)(x)


def loss_fn(model, batch):
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


def count_correct(model, batch):
    return jnp.sum(jnp.argmax(model(batch["x"]), -1) == batch["y"])


state = TrainState.from_linen(MLP(), x[:2], optax.adam(2e-3), seed=0, rngs=("dropout",))
trainer = create_trainer(state, loss_fn)
evaluator = create_evaluator(trainer, count_correct)


@trainer.on(Events.ITERATION_COMPLETED(every=100))
def log_loss(engine: Engine) -> None:
    print(f"iteration {engine.state.iteration:4d}  loss {float(engine.state.output['loss']):.4f}")


@trainer.on(Events.EPOCH_COMPLETED)
def validate(engine: Engine) -> None:
    evaluator.run(val)
    accuracy = int(evaluator.state.output) / val.num_examples
    engine.state.metrics["val_accuracy"] = accuracy
    print(f"epoch {engine.state.epoch:2d}  validation accuracy {accuracy:.3f}")


if __name__ == "__main__":
    trainer.run(train, max_epochs=10)
    assert trainer.state.metrics["val_accuracy"] > 0.93, trainer.state.metrics
