"""The flax-extra loop style: ``for state in trainer.iterate(...)``, with the engine doing the work.

``Engine.iterate(data, event)`` runs the trainer as a generator that yields its state each time ``event``
fires (here every 50 iterations), after that event's handlers ran. The body of the loop is the place for
what flax-extra users put there: reporting, evaluating, deciding to stop. Breaking out leaves the engine
resumable; the next ``iterate`` or ``run`` continues from there.

Run: ``python examples/iterate_loop.py``  (needs ``pip install -e ".[examples]"``)
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

from ember import Events
from ember.data import ArrayDataset
from ember.training import TrainState, create_trainer

digits = load_digits()
x = (digits.images / 16.0).astype(np.float32).reshape(-1, 64)
y = digits.target.astype(np.int32)
data = ArrayDataset({"x": x, "y": y}, batch_size=64, shuffle=True, drop_remainder=True)

params = {"w": np.zeros((64, 10), np.float32), "b": np.zeros(10, np.float32)}
state = TrainState.create(lambda p, x: x @ p["w"] + p["b"], params, optax.adam(1e-2))


def loss_fn(model, batch):
    logits = model(batch["x"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["y"])}


trainer = create_trainer(state, loss_fn, extras=("grad_norm",))

if __name__ == "__main__":
    for st in trainer.iterate(data, Events.ITERATION_COMPLETED(every=50), max_epochs=20):
        out = st.output  # device values: read only here, every 50 iterations
        print(
            f"step {st.iteration:4d}  loss {float(out['loss']):.4f}  batch accuracy {float(out['accuracy']):.3f}  "
            f"grad norm {float(out['grad_norm']):.3f}"
        )
        if float(out["accuracy"]) > 0.97:
            print("good enough: leaving the loop (the engine stays resumable)")
            break
    print(f"stopped at iteration {trainer.state.iteration}")
