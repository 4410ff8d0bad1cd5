"""A run killed with SIGKILL (no chance to clean up) and resumed: the result equals an uninterrupted run.

The script starts itself as a training subprocess that checkpoints every 5 iterations (in the
background, atomically), kills it with SIGKILL once a checkpoint at iteration 20 is on disk, starts it
again — the same command, which resumes from the latest valid checkpoint — and compares the final
parameters with a run that was never interrupted, bit for bit.

Run: ``python examples/kill_and_resume.py``  (needs ``pip install -e ".[examples]"``)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np
import optax
from flax import linen as nn
from sklearn.datasets import load_digits

from ember import Events
from ember.data import ArrayDataset
from ember.handlers import Checkpoint
from ember.training import TrainState, create_trainer


class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Dropout(0.2, deterministic=not train)(nn.relu(nn.Dense(32)(x)))
        return nn.Dense(10)(x)


def loss_fn(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()


def run(folder: Path | None, out: Path) -> None:
    """Train 3 epochs (resuming from ``folder`` if it holds a checkpoint); save the final parameters."""
    digits = load_digits()
    arrays = {"x": (digits.images / 16.0).astype(np.float32).reshape(-1, 64), "y": digits.target.astype(np.int32)}
    data = ArrayDataset(arrays, batch_size=64, shuffle=True, seed=0, drop_remainder=True)
    state = TrainState.from_linen(Net(), arrays["x"][:1], optax.adam(1e-2), seed=0, rngs=("dropout",))
    trainer = create_trainer(state, loss_fn)
    if folder is not None:
        saver = Checkpoint({"trainer": trainer}, folder, n_saved=2)
        saver.attach(trainer, Events.ITERATION_COMPLETED(every=5))
        info = saver.resume()
        print(f"resumed at iteration {info.step}" if info else "starting from scratch", flush=True)

        @trainer.on(Events.ITERATION_COMPLETED(every=5))
        def report(engine):
            saver.store.wait()  # for the demo: say so only once the checkpoint is on disk
            print(f"checkpoint at {engine.state.iteration} on disk", flush=True)

    trainer.run(data, max_epochs=3)
    np.savez(out, *[np.asarray(x) for x in jax.tree.leaves(trainer.state.train_state.params)])


if __name__ == "__main__":
    if len(sys.argv) == 3:  # the child: python kill_and_resume.py FOLDER OUT
        run(Path(sys.argv[1]), Path(sys.argv[2]))
        sys.exit(0)
    work = Path(tempfile.mkdtemp())
    child = [sys.executable, __file__, str(work / "ckpt"), str(work / "resumed.npz")]
    proc = subprocess.Popen(child, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:  # type: ignore[union-attr]
        print("child:", line.strip())
        if line.strip() == "checkpoint at 20 on disk":
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    proc.stdout.close()  # type: ignore[union-attr]
    print(f"killed the child with SIGKILL (exit status {proc.returncode})")
    out = subprocess.run(child, capture_output=True, text=True, check=True).stdout.splitlines()
    print("child:", out[0], "...", out[-1])
    run(None, work / "straight.npz")
    with np.load(work / "resumed.npz") as a, np.load(work / "straight.npz") as b:
        same = all(np.array_equal(a[k], b[k]) for k in a.files)
    print(f"resumed run equals the uninterrupted run bit for bit: {same}")
    sys.exit(0 if same else 1)
