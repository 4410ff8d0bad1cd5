"""Runs for the exact-resume and preemption tests, each phase in its own process.

``python -m tests.handlers.resume_script PHASE WORKDIR`` with PHASE one of ``first`` (straight runs and
runs stopped at iteration k), ``train-sigterm`` / ``eval-sigterm`` (wait for SIGTERM from the test, in
training or in evaluation), and ``resume`` (restore every stopped run in this fresh process and finish).
Final parameters and counters go to ``WORKDIR/<name>.npz`` / ``.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ember import Events
from ember.data import ArrayDataset
from ember.handlers import Checkpoint, EarlyStopping, Evaluate, Preemption
from ember.metrics import Average
from ember.training import TrainState, create_evaluator, create_trainer
from tests.training.models import LinenNet, NNXNet, batches, classification_loss

ARRAYS = {"x": np.concatenate([b["x"] for b in batches(4)]), "y": np.concatenate([b["y"] for b in batches(4)])}
MAX_EPOCHS = 6  # 4 iterations per epoch


def build(model: str, early_stopping: bool = True):
    """A trainer, its shuffled data, an evaluator run every epoch, and the handlers to save."""
    if model == "linen":
        state = TrainState.from_linen(LinenNet(), ARRAYS["x"][:2], optax.adam(1e-2), seed=0, rngs=("dropout",))
    else:
        state = TrainState.from_nnx(NNXNet(nnx.Rngs(0)), optax.adam(1e-2), seed=0)
    trainer = create_trainer(state, classification_loss)
    data = ArrayDataset(ARRAYS, batch_size=16, shuffle=True, seed=3)
    evaluator = create_evaluator(trainer, lambda m, b: {"loss": classification_loss(m, b)[0]})
    Average(key="loss").attach(evaluator, "loss")
    to_save = {"trainer": trainer}
    Evaluate(evaluator, [{"x": ARRAYS["x"][:16], "y": ARRAYS["y"][:16]}]).attach(trainer)
    if early_stopping:  # no validation loss ever improves by 10: stops after 3 evaluations past the first
        stop = EarlyStopping(3, lambda e: e.state.metrics["loss"], trainer, threshold=10.0, mode="min")
        stop.attach(evaluator)
        to_save["early_stopping"] = stop
    return trainer, data, evaluator, to_save


def record(workdir: Path, name: str, trainer, to_save) -> None:
    def host(x):
        return np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)

    leaves = {str(i): host(x) for i, x in enumerate(jax.tree.leaves(trainer.state.train_state))}
    np.savez(workdir / f"{name}.npz", **leaves)
    info = {"iteration": trainer.state.iteration, "epoch": trainer.state.epoch}
    if "early_stopping" in to_save:
        info["counter"] = to_save["early_stopping"].counter
    (workdir / f"{name}.json").write_text(json.dumps(info))


def first(workdir: Path) -> None:
    for model in ("linen", "nnx"):
        trainer, data, _, to_save = build(model)
        trainer.run(data, max_epochs=MAX_EPOCHS)
        record(workdir, f"straight-{model}", trainer, to_save)
        for k in (8, 10):  # an epoch boundary, and mid-epoch with the early-stopping counter at 1
            trainer, data, _, to_save = build(model)
            Checkpoint(to_save, workdir / f"ckpt-{model}-{k}").attach(trainer, Events.ITERATION_COMPLETED(every=2))
            trainer.add_event_handler(Events.ITERATION_COMPLETED(once=k), lambda e: e.terminate())
            trainer.run(data, max_epochs=MAX_EPOCHS)
    trainer, data, _, to_save = build("linen", early_stopping=False)
    trainer.run(data, max_epochs=3)
    record(workdir, "straight-linen-no-es", trainer, to_save)


def wait_for_signal(preemption: Preemption, message: str) -> None:
    print(message, flush=True)
    deadline = time.monotonic() + 60
    while preemption.requested is None and time.monotonic() < deadline:
        time.sleep(0.01)


def sigterm(workdir: Path, during: str) -> None:
    trainer, data, evaluator, to_save = build("linen", early_stopping=False)
    saver = Checkpoint(to_save, workdir / f"ckpt-{during}-sigterm", n_saved=None)
    saver.attach(trainer, Events.ITERATION_COMPLETED(every=100))
    preemption = Preemption(saver)
    preemption.attach(trainer, [evaluator])
    if during == "train":
        trainer.add_event_handler(Events.ITERATION_COMPLETED(once=5), lambda: wait_for_signal(preemption, "READY"))
    else:
        evaluator.add_event_handler(Events.COMPLETED, lambda: print("EVALUATED", flush=True))
        trainer.add_event_handler(
            Events.EPOCH_STARTED(once=2),
            lambda: evaluator.add_event_handler(
                Events.ITERATION_STARTED(once=1), lambda: wait_for_signal(preemption, "READY")
            ),
        )
    trainer.run(data, max_epochs=3)
    print(f"EXIT iteration={trainer.state.iteration} saved={preemption.saved.step}", flush=True)


def resume(workdir: Path) -> None:
    for model in ("linen", "nnx"):
        for k in (8, 10):
            trainer, data, _, to_save = build(model)
            info = Checkpoint(to_save, workdir / f"ckpt-{model}-{k}").resume()
            if info is None or info.step != k:
                raise AssertionError(f"expected the checkpoint of step {k}, got {info}")
            trainer.run(data)
            record(workdir, f"resumed-{model}-{k}", trainer, to_save)
    for during in ("train", "eval"):
        trainer, data, _, to_save = build("linen", early_stopping=False)
        Checkpoint(to_save, workdir / f"ckpt-{during}-sigterm").resume()
        trainer.run(data)
        record(workdir, f"resumed-{during}-sigterm", trainer, to_save)


if __name__ == "__main__":
    phase, out = sys.argv[1], Path(sys.argv[2])
    if phase == "first":
        first(out)
    elif phase.endswith("-sigterm"):
        sigterm(out, phase.split("-")[0])
    else:
        resume(out)
