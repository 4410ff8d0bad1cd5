"""A handler written from scratch: early stopping on validation loss, with its own checkpointable state.

Any callable is a handler. This one keeps the best loss and a count of evaluations without improvement,
stops the trainer when the count reaches ``patience``, and has ``state_dict``/``load_state_dict`` so a
``Checkpoint`` saves it with the run and a resumed run stops where the original would have.

Run: ``python examples/custom_early_stopping.py``  (needs ``pip install -e ".[examples]"``)
"""

from __future__ import annotations

import numpy as np
import optax
from sklearn.datasets import load_digits

from ember import Engine, Events
from ember.data import ArrayDataset
from ember.metrics import Loss
from ember.training import TrainState, create_evaluator, create_trainer


class StopWhenStuck:
    """Terminate ``trainer`` after ``patience`` evaluations whose loss is not below the best so far."""

    def __init__(self, trainer: Engine, patience: int = 2) -> None:
        self.trainer, self.patience, self.best, self.bad = trainer, patience, float("inf"), 0

    def __call__(self, evaluator: Engine) -> None:
        loss = evaluator.state.metrics["loss"]
        self.best, self.bad = (loss, 0) if loss < self.best else (self.best, self.bad + 1)
        if self.bad >= self.patience:
            print(f"no improvement for {self.bad} evaluations (best {self.best:.4f}): stopping")
            self.trainer.terminate()

    def state_dict(self) -> dict[str, float]:
        return {"best": self.best, "bad": self.bad}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.best, self.bad = state["best"], int(state["bad"])


digits = load_digits()
x = (digits.images / 16.0).astype(np.float32).reshape(-1, 64)
y = digits.target.astype(np.int32)
train = ArrayDataset({"x": x[:1400], "y": y[:1400]}, batch_size=100, shuffle=True, drop_remainder=True)
val = [{"x": x[1400:], "y": y[1400:]}]

params = {"w": np.zeros((64, 10), np.float32), "b": np.zeros(10, np.float32)}
state = TrainState.create(lambda p, x: x @ p["w"] + p["b"], params, optax.sgd(2.0))  # too large a step, on purpose


def loss_fn(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()


trainer = create_trainer(state, loss_fn)
evaluator = create_evaluator(trainer, lambda model, b: {"y_pred": model(b["x"]), "y": b["y"]})
Loss(optax.softmax_cross_entropy_with_integer_labels).attach(evaluator, "loss")


@evaluator.on(Events.COMPLETED)  # registered before the stopper, so each epoch's line comes before its verdict
def report(evaluator: Engine) -> None:
    print(f"epoch {trainer.state.epoch:2d}  val loss {evaluator.state.metrics['loss']:.4f}")


evaluator.add_event_handler(Events.COMPLETED, StopWhenStuck(trainer, patience=2))
trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: evaluator.run(val))


if __name__ == "__main__":
    state = trainer.run(train, max_epochs=50)
    print(f"stopped at epoch {state.epoch} of 50")
