"""An Ignite user's script, in ember: supervised shortcuts, metrics, early stopping, checkpoints, a progress bar.

``create_supervised_trainer(model, optimizer, loss_fn)`` trains on ``(x, y)`` batches with
``loss_fn(y_pred, y)``; ``create_supervised_evaluator(trainer, metrics=...)`` evaluates with Ignite-style
metrics. Handlers attach exactly as in Ignite; the compiled step, device placement and prefetch are
ember's.

Run: ``python examples/ignite_style.py``  (needs ``pip install -e ".[examples]"`` for scikit-learn)
"""

from __future__ import annotations

import tempfile

import numpy as np
import optax
from flax import linen as nn
from sklearn.datasets import load_digits

from ember import Events
from ember.data import ArrayDataset
from ember.handlers import Checkpoint, EarlyStopping, ProgressBar, global_step_from_engine
from ember.metrics import Accuracy, Loss
from ember.training import create_supervised_evaluator, create_supervised_trainer

digits = load_digits()
x = (digits.images / 16.0).astype(np.float32).reshape(-1, 64)
y = digits.target.astype(np.int32)
train = ArrayDataset((x[:1400], y[:1400]), batch_size=50, shuffle=True, drop_remainder=True)
val = ArrayDataset((x[1400:], y[1400:]), batch_size=397)


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(nn.relu(nn.Dense(64)(x)))


def loss_fn(y_pred, y):  # the mean over the batch, as torch.nn.CrossEntropyLoss gives an Ignite user
    return optax.softmax_cross_entropy_with_integer_labels(y_pred, y).mean()


trainer = create_supervised_trainer(Net(), optax.adam(1e-2), loss_fn)
per_example = optax.softmax_cross_entropy_with_integer_labels
evaluator = create_supervised_evaluator(trainer, metrics={"accuracy": Accuracy(), "nll": Loss(per_example)})

ProgressBar(refresh_every=7, persist=True).attach(trainer, output_keys=["loss"])  # tqdm on stderr, as in Ignite


@trainer.on(Events.EPOCH_COMPLETED)
def log_validation(engine):
    evaluator.run(val)
    m = evaluator.state.metrics
    print(f"epoch {engine.state.epoch}: val accuracy {m['accuracy']:.3f}  nll {m['nll']:.3f}")


EarlyStopping(3, lambda e: -e.state.metrics["nll"], trainer).attach(evaluator)
best = Checkpoint(
    {"trainer": trainer},
    tempfile.mkdtemp(),
    n_saved=1,
    score_function=lambda e: e.state.metrics["accuracy"],
    score_name="val_accuracy",
    global_step_transform=global_step_from_engine(trainer),
)
best.attach(evaluator, Events.COMPLETED)

if __name__ == "__main__":
    trainer.run(train, max_epochs=10)
    print("best checkpoint:", best.store.best("val_accuracy").path.name)
