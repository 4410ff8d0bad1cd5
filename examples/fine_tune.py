"""Fine-tune from another run: learn digits 0-4, then start 5-9 from those weights with a new head.

The second run starts from the first's checkpoint with `init_from`: the body's weights are taken, the new head is
left at its fresh initialisation, and a new optimizer trains the body at a fiftieth of the head's learning rate.
Beside it, the same model trains from scratch on the same 100 examples for as many steps. On these small 8x8
images the two end close: a body learnt on five digits is worth about as much as a random one for the other five.
The code is what carries over to a real pretrained model.

Run: ``python examples/fine_tune.py``  (needs ``pip install -e ".[examples]"`` for scikit-learn)
"""

from __future__ import annotations

import tempfile

import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from sklearn.datasets import load_digits

from ember.checkpoint import init_from
from ember.data import ArrayDataset
from ember.handlers import Checkpoint
from ember.training import TrainState, create_evaluator, create_trainer

digits = load_digits()  # 1,797 real 8x8 images shipped inside scikit-learn
order = np.random.default_rng(0).permutation(len(digits.target))
x = (digits.data[order] / 16.0).astype(np.float32)
y = digits.target[order].astype(np.int32)
first, second = y < 5, y >= 5
new_x, new_y = x[second], y[second] - 5  # digits 5-9 as the new head's classes 0-4
few = np.concatenate([np.flatnonzero(new_y == c)[:20] for c in range(5)])  # 20 labelled examples of each
held_out = np.setdiff1d(np.arange(len(new_y)), few)


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(128, name="body")(x))
        return nn.Dense(5, name="head")(x)


def loss_fn(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()


def count_correct(model, batch):
    return jnp.sum(jnp.argmax(model(batch["x"]), -1) == batch["y"])


def digits_5_to_9(state: TrainState) -> float:
    """``state`` trained for 20 steps on the 100 examples; its accuracy on the other images of 5-9."""
    trainer = create_trainer(state, loss_fn)
    trainer.run(ArrayDataset({"x": new_x[few], "y": new_y[few]}, batch_size=len(few)), max_epochs=20)
    evaluator = create_evaluator(trainer, count_correct)
    evaluator.run(ArrayDataset({"x": new_x[held_out], "y": new_y[held_out]}, batch_size=len(held_out)))
    return int(evaluator.state.output) / len(held_out)


if __name__ == "__main__":
    folder = tempfile.mkdtemp()
    source = create_trainer(TrainState.from_linen(Net(), x[:2], optax.adam(2e-3), seed=0), loss_fn)
    source.run(ArrayDataset({"x": x[first], "y": y[first]}, batch_size=50, shuffle=True, seed=0), max_epochs=10)
    Checkpoint({"trainer": source}, folder).save_now(source)  # the run we start from

    rates = {"body": optax.adam(2e-4), "head": optax.adam(1e-2)}  # the body learns slowly, the new head fast
    tx = optax.multi_transform(rates, lambda params: {name: name for name in params})
    tuned, report = init_from(TrainState.from_linen(Net(), x[:2], tx, seed=1), folder, fresh=["params.head"])
    print(report)
    fine_tuned = digits_5_to_9(tuned)
    from_scratch = digits_5_to_9(TrainState.from_linen(Net(), x[:2], optax.adam(2e-3), seed=1))
    print(f"digits 5-9 after 20 steps on 100 examples: fine-tuned {fine_tuned:.3f}, from scratch {from_scratch:.3f}")
