"""The soak test: a long run with evaluation, a checkpoint every minute and logging (``pytest -m slow``).

``EMBER_SOAK_SECONDS`` sets the length (1800 by default). Checked: resident memory grows by less than 5%
from the end of the warm-up to the end, open file descriptors do not grow, and every checkpoint written
restores. The numbers are printed (``-s``) for docs/reliability.md.
"""

import os
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ember import Events
from ember.checkpoint import CheckpointStore
from ember.data import ArrayDataset
from ember.handlers import Checkpoint, Evaluate, ScalarLogger
from ember.metrics import Accuracy, Loss, RunningAverage
from ember.training import TrainState, create_evaluator, create_trainer
from ember.writers import create_run_writer


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
def test_a_long_run_keeps_memory_and_file_handles_flat_and_every_checkpoint_restores(tmp_path):
    seconds = float(os.environ.get("EMBER_SOAK_SECONDS", "1800"))
    warmup = min(120.0, seconds / 5)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 32)).astype(np.float32)
    y = (x[:, :3].sum(1) > 0).astype(np.int32) + (x[:, 3] > 1).astype(np.int32)
    train = ArrayDataset({"x": x[:3584], "y": y[:3584]}, batch_size=64, shuffle=True, drop_remainder=True)
    val = [{"x": x[3584:], "y": y[3584:]}]
    params = {"w1": jnp.asarray(rng.normal(size=(32, 64)) * 0.1, jnp.float32), "w2": jnp.zeros((64, 3))}
    state = TrainState.create(lambda p, x: jnp.tanh(x @ p["w1"]) @ p["w2"], params, optax.adam(1e-3))

    def loss_fn(model, batch):
        logits = model(batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), {"y_pred": logits}

    trainer = create_trainer(state, loss_fn)
    evaluator = create_evaluator(trainer, lambda m, b: {"y_pred": m(b["x"]), "y": b["y"]})
    Accuracy().attach(evaluator, "accuracy")
    Loss(optax.softmax_cross_entropy_with_integer_labels).attach(evaluator, "loss")
    RunningAverage(output_transform=lambda o: o["loss"]).attach(trainer, "loss")
    writer = create_run_writer(tmp_path / "run", ["tensorboard", "jsonl", "csv"])
    ScalarLogger(writer, tag="train", metric_names=["loss"]).attach(trainer, Events.ITERATION_COMPLETED(every=100))
    Evaluate(evaluator, val, writer=writer).attach(trainer, Events.EPOCH_COMPLETED(every=10))
    saver = Checkpoint({"trainer": trainer}, tmp_path / "ckpt", n_saved=None)
    saver.attach(trainer, Events.ITERATION_COMPLETED(every_secs=60.0))
    samples: list[tuple[float, int, int]] = []
    start = time.monotonic()

    def sample(_):
        samples.append((time.monotonic() - start, rss_bytes(), open_fds()))

    trainer.add_event_handler(Events.EPOCH_COMPLETED(every=100), sample)
    trainer.add_event_handler(
        Events.EPOCH_COMPLETED, lambda e: e.terminate() if time.monotonic() - start > seconds else None
    )
    trainer.run(train, max_epochs=10**9)
    writer.close()

    after_warmup = next(s for s in samples if s[0] >= warmup)
    end = samples[-1]
    growth = end[1] / after_warmup[1] - 1
    checkpoints = CheckpointStore(tmp_path / "ckpt").checkpoints()
    target = {"trainer": trainer.tree_state_dict()}
    for info in checkpoints:
        CheckpointStore(tmp_path / "ckpt").restore(target=target, checkpoint=info)
    print(
        f"\nsoak: {seconds:.0f} s, {trainer.state.iteration} iterations, {trainer.state.epoch} epochs, "
        f"{len(checkpoints)} checkpoints (all restored); RSS {after_warmup[1] / 1e6:.1f} MB after "
        f"{after_warmup[0]:.0f} s warm-up -> {end[1] / 1e6:.1f} MB at {end[0]:.0f} s ({growth:+.2%}); "
        f"open fds {after_warmup[2]} -> {end[2]}"
    )
    assert growth < 0.05
    assert end[2] <= after_warmup[2]
    assert len(checkpoints) >= int(seconds // 60) - 1
