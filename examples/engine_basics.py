"""Engine basics: the event engine driving a small least-squares fit (NumPy only, runs in a second).

The process function does one gradient step per batch; handlers attached with filters log, evaluate,
and stop early. The same engine wraps compiled JAX steps in `ember.training`.

Run: ``python examples/engine_basics.py``
"""

from __future__ import annotations

import numpy as np

from ember import Engine, Events

rng = np.random.default_rng(0)
true_w = np.array([2.0, -3.0, 0.5])
x = rng.normal(size=(512, 3))
y = x @ true_w + 0.01 * rng.normal(size=512)
batches = [(x[i : i + 32], y[i : i + 32]) for i in range(0, 512, 32)]

w = np.zeros(3)


def train_step(engine: Engine, batch: tuple[np.ndarray, np.ndarray]) -> float:
    global w
    xb, yb = batch
    err = xb @ w - yb
    w = w - 0.1 * (2 * xb.T @ err / len(yb))
    return float(np.mean(err**2))


trainer = Engine(train_step)


@trainer.on(Events.ITERATION_COMPLETED(every=16))
def log_loss(engine: Engine) -> None:
    print(f"epoch {engine.state.epoch:2d}  iteration {engine.state.iteration:4d}  loss {engine.state.output:.6f}")


@trainer.on(Events.EPOCH_COMPLETED)
def stop_when_converged(engine: Engine) -> None:
    if engine.state.output < 2e-4:
        print(f"converged after {engine.state.epoch} epochs")
        engine.terminate()


@trainer.on(Events.COMPLETED)
def report(engine: Engine) -> None:
    print(f"learned w = {np.round(w, 3).tolist()}  (true {true_w.tolist()})")
    print(f"engine state to checkpoint: {engine.state_dict()}")


if __name__ == "__main__":
    state = trainer.run(batches, max_epochs=20)
    assert np.allclose(w, true_w, atol=0.01), w
