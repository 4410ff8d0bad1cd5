"""Custom events: a handler fires its own event, and other handlers attach to it with filters.

``EventEnum`` declares events; ``register_events`` tells an engine about them, with ``event_to_attr``
naming the ``engine.state`` counter that filters such as ``every=`` read (as in Ignite, whoever fires
the event keeps that counter); ``fire_event`` fires one. Here a
"new best" event fires whenever validation accuracy improves, and two handlers react to it.

Run: ``python examples/custom_events.py``  (needs ``pip install -e ".[examples]"``)
"""

from __future__ import annotations

import numpy as np
import optax
from sklearn.datasets import load_digits

from ember import Engine, EventEnum, Events
from ember.data import ArrayDataset
from ember.metrics import Accuracy
from ember.training import TrainState, create_evaluator, create_trainer


class RunEvents(EventEnum):
    NEW_BEST = "new_best"


digits = load_digits()
x = (digits.images / 16.0).astype(np.float32).reshape(-1, 64)
y = digits.target.astype(np.int32)
train = ArrayDataset({"x": x[:1400], "y": y[:1400]}, batch_size=70, shuffle=True, drop_remainder=True)
val = [{"x": x[1400:], "y": y[1400:]}]
params = {"w": np.zeros((64, 10), np.float32), "b": np.zeros(10, np.float32)}
state = TrainState.create(lambda p, x: x @ p["w"] + p["b"], params, optax.adam(3e-3))


def loss_fn(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()


trainer = create_trainer(state, loss_fn)
trainer.register_events(*RunEvents, event_to_attr={RunEvents.NEW_BEST: "new_bests"})
evaluator = create_evaluator(trainer, lambda model, b: {"y_pred": model(b["x"]), "y": b["y"]})
Accuracy().attach(evaluator, "accuracy")
best = {"accuracy": 0.0}


@trainer.on(Events.EPOCH_COMPLETED)
def validate(engine: Engine) -> None:
    evaluator.run(val)
    accuracy = evaluator.state.metrics["accuracy"]
    if accuracy > best["accuracy"]:
        best["accuracy"] = accuracy
        engine.state.new_bests = getattr(engine.state, "new_bests", 0) + 1
        engine.fire_event(RunEvents.NEW_BEST)


@trainer.on(RunEvents.NEW_BEST)
def announce(engine: Engine) -> None:
    print(f"epoch {engine.state.epoch:2d}: new best validation accuracy {best['accuracy']:.3f}")


@trainer.on(RunEvents.NEW_BEST(every=3))
def every_third(engine: Engine) -> None:
    print(f"  ({engine.state.new_bests} improvements so far)")


if __name__ == "__main__":
    trainer.run(train, max_epochs=12)
