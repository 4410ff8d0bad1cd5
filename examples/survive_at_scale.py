"""A run that survives, on 8 devices: two checkpoint tiers, rollback, a stall watchdog, a ledger.

A digits MLP trains with FSDP over 8 devices (simulated by XLA on a CPU-only machine). Every 2
iterations a checkpoint goes into a `TieredStore`: its fast tier (a temporary folder here;
`/dev/shm` or local NVMe on a real node) gets every one, the run folder every 3rd and the last.
Three batches of each epoch are poisoned (NaN): the step guard skips their updates, and after 3
skips in a row `RollbackOnDivergence` restores the checkpoint saved before them. A
`StallWatchdog` would end a hung run with status 75 (a scheduler's cue to requeue it), and the
`GoodputLedger` records where the time went. Then a relaunch resumes from the fast tier, and
another, with the fast tier wiped (a replaced node), from the durable one.

Run: ``python examples/survive_at_scale.py``
"""

from __future__ import annotations

import os
import shutil
import tempfile

# 8 simulated CPU devices (unless XLA_FLAGS names a count); set before JAX starts
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=8"

import jax
import numpy as np
import optax
from flax import linen as nn
from sklearn.datasets import load_digits

from ember import Events
from ember.checkpoint import TieredStore
from ember.cli import goodput_table
from ember.data import ArrayDataset
from ember.handlers import (
    Checkpoint,
    GoodputLedger,
    RollbackOnDivergence,
    StallWatchdog,
)
from ember.training import TrainState, create_trainer, fsdp

digits = load_digits()
x = (digits.data / 16).astype(np.float32)[:1536]
y = digits.target.astype(np.int32)[:1536]
x[640:1024] = np.nan  # batches 6-8 of each epoch (128 examples a batch, in order)
data = ArrayDataset({"x": x, "y": y}, batch_size=128)


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        return nn.Dense(10)(nn.relu(nn.Dense(256)(x)))


def loss(model, batch):
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


def launch(run: str, fast: str):
    """A trainer over 8 devices, its checkpoints in two tiers, resumed if it can be."""
    placement = fsdp(min_size=1024)  # each device holds an eighth of each large kernel
    state = TrainState.from_linen(MLP(), x[:2], optax.adam(1e-2), placement=placement)
    trainer = create_trainer(state, loss, placement=placement, skip_nonfinite=True)
    store = TieredStore(fast, f"{run}/checkpoints", durable_every=3, keep_fast=3)
    saver = Checkpoint({"trainer": trainer}, store, n_saved=3)  # reaches past 3 skips
    saver.attach(trainer, Events.ITERATION_COMPLETED(every=2))
    return trainer, store, saver, saver.resume()


def tier(store: TieredStore, info) -> str:
    return "fast" if store.fast.holds(info) else "durable"


root = tempfile.mkdtemp()
run, fast = f"{root}/run", f"{root}/fast"
trainer, store, saver, _ = launch(run, fast)
rollback = RollbackOnDivergence(saver, after=3)
rollback.attach(trainer)
watchdog = StallWatchdog(run, step_timeout=600, startup_timeout=1800)
watchdog.attach(trainer, checkpoints=[saver])
GoodputLedger(run).attach(trainer, checkpoints=[saver])
trainer.run(data, max_epochs=2)
print(f"{len(jax.devices())} devices; trained {trainer.state.iteration} iterations")
for done in rollback.rollbacks:
    print(f"rolled back to iteration {done.restored}, past iterations {done.dropped}")
fast_steps = [c.step for c in store.fast.checkpoints()]
durable_steps = [c.step for c in store.durable.checkpoints()]
print(f"fast tier: {fast_steps} durable: {durable_steps}")
print(goodput_table(run).splitlines()[-2].split(",")[0].strip())  # the goodput

_, again, _, info = launch(run, fast)
print(f"relaunched: from iteration {info.step}, {tier(again, info)} tier")
shutil.rmtree(fast)  # the node is replaced: its local storage is gone
_, again, _, info = launch(run, fast)
print(f"fast tier wiped: from iteration {info.step}, {tier(again, info)} tier")
shutil.rmtree(root)
