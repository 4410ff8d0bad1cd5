"""A small real training job that a scheduler relaunches until it completes (issue: resume that always continues).

One run: a shuffled ``ArrayDataset``, a trainer with a running average and an epoch-wise average, an
evaluator that iterates the training data each epoch (as Ignite's examples do), ``Checkpoint`` at epoch or
iteration events with ``Preemption``, then ``resume()`` and ``run()``. Each epoch's metric values go into
``history.json`` in the folder (a relaunch that redoes an epoch overwrites its entry), and a completed run
writes ``final.npz`` and ``final.json``.

In-process, :func:`job` takes an ``interrupt`` point at which it raises :class:`Interrupted`. As a script
(``python -m tests.handlers.relaunch_job FOLDER SAVE [POINT]``) it prints ``READY`` at ``POINT`` and
waits there, for the test to send SIGKILL or SIGTERM.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ember import Events
from ember.data import ArrayDataset
from ember.handlers import Checkpoint, Preemption
from ember.metrics import Accuracy, Average, RunningAverage
from ember.training import TrainState, create_evaluator, create_trainer

EPOCHS, BATCHES = 3, 4  # 12 iterations

#: Where a run is interrupted: (engine, event, how many times that event has fired in this launch).
POINTS: dict[str, tuple[str, Events, int]] = {
    "mid-epoch": ("trainer", Events.ITERATION_COMPLETED, 6),
    "an epoch's last iteration": ("trainer", Events.ITERATION_COMPLETED, 8),
    "EPOCH_COMPLETED": ("trainer", Events.EPOCH_COMPLETED, 2),
    "during evaluation": ("evaluator", Events.ITERATION_COMPLETED, 6),  # the second epoch's evaluation
    "during the last evaluation": ("evaluator", Events.ITERATION_COMPLETED, 10),
}


class Interrupted(Exception):
    """Raised by the job at its interrupt point (the in-process stand-in for a crash)."""


def dataset() -> ArrayDataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCHES * 16, 4)).astype(np.float32)
    y = ((x[:, 0] + x[:, 1] > 0).astype(np.int32) + (x[:, 2] > 0.5)).astype(np.int32)
    return ArrayDataset({"x": x, "y": y}, batch_size=16, shuffle=True, seed=3, drop_remainder=True)


def loss_fn(model: Any, batch: Any) -> Any:
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), {"y_pred": logits}


def eval_fn(model: Any, batch: Any) -> Any:
    return {"y_pred": model(batch["x"]), "y": batch["y"]}


def job(folder: Path, save: str, interrupt: str | None = None, on_point: Any = None, setup: Any = None) -> Any:
    """One launch: resume from ``folder`` if a checkpoint is there, train to the end; return the trainer.

    ``save``: ``"epoch"`` saves at EPOCH_COMPLETED; ``"iteration"`` every 2 iterations and at COMPLETED.
    ``setup(trainer)`` runs before the resume.
    """
    data = dataset()
    params = {"w": jnp.zeros((4, 3)), "b": jnp.zeros(3)}
    state = TrainState.create(lambda p, x: x @ p["w"] + p["b"], params, optax.adam(0.05))
    trainer = create_trainer(state, loss_fn)
    RunningAverage(output_transform=lambda out: out["loss"]).attach(trainer, "running_loss")
    Average(output_transform=lambda out: out["loss"]).attach(trainer, "epoch_loss")
    evaluator = create_evaluator(trainer, eval_fn)
    Accuracy().attach(evaluator, "accuracy")
    history_file = folder / "history.json"

    @trainer.on(Events.EPOCH_COMPLETED)
    def evaluate(engine: Any) -> None:
        evaluator.run(data)
        history = json.loads(history_file.read_text()) if history_file.exists() else {}
        history[str(engine.state.epoch)] = {
            "running_loss": float(engine.state.metrics["running_loss"]),
            "epoch_loss": engine.state.metrics["epoch_loss"],
            "accuracy": evaluator.state.metrics["accuracy"],
        }
        history_file.write_text(json.dumps(history, indent=1))

    saver = Checkpoint({"trainer": trainer}, folder / "checkpoints", n_saved=2)
    event = Events.EPOCH_COMPLETED if save == "epoch" else Events.ITERATION_COMPLETED(every=2) | Events.COMPLETED
    saver.attach(trainer, event)
    preemption = Preemption(saver)
    preemption.attach(trainer, [evaluator])
    if interrupt is not None:
        which, point_event, times = POINTS[interrupt]
        engine = trainer if which == "trainer" else evaluator
        seen = [0]

        def at_point() -> None:
            seen[0] += 1
            if seen[0] == times:
                (on_point or _raise)(preemption)

        engine.add_event_handler(point_event, at_point)

    if setup is not None:
        setup(trainer)
    saver.resume()
    try:
        trainer.run(data, max_epochs=EPOCHS)
    finally:
        saver.store.wait()  # as a process does at exit: the write in flight finishes
    if trainer.state.iteration == EPOCHS * BATCHES and preemption.saved is None:  # not stopped by a signal
        leaves = jax.tree.leaves(trainer.state.train_state)
        np.savez(folder / "final.npz", *[np.asarray(x) for x in leaves])
        final = {"iteration": trainer.state.iteration, "running_loss": float(trainer.state.metrics["running_loss"])}
        (folder / "final.json").write_text(json.dumps(final))
    return trainer


def _raise(_preemption: Preemption) -> None:
    raise Interrupted


def _wait_for_signal(preemption: Preemption) -> None:
    """Say READY and wait: SIGKILL ends the process here; after SIGTERM, Preemption saves at the next boundary."""
    print("READY", flush=True)
    for _ in range(1200):  # at most 120 s
        time.sleep(0.1)
        if preemption.requested is not None:
            return


def _main() -> None:
    folder, save = Path(sys.argv[1]), sys.argv[2]
    point = sys.argv[3] if len(sys.argv) > 3 else None
    job(folder, save, point, on_point=_wait_for_signal)
    print("DONE", flush=True)


if __name__ == "__main__":
    _main()
