"""Data parallel training on 8 devices, with a Mesh (jit + NamedSharding) and, with ``--pmap``, with pmap.

On a CPU the 8 devices are simulated (``--xla_force_host_platform_device_count=8``); on a machine with
several accelerators the same code uses them. Each placement trains to the same parameters as one device
would on the same global batches.

pmap is opt-in here because on simulated CPU devices XLA:CPU occasionally deadlocks in pmap's first
all-reduce (about one run in eight of this script on a 2-core machine; see docs/concepts/training.md).
The ``Pmap`` placement itself is tested against one device in tests/training/test_placement.py.

Run: ``python examples/data_parallel.py [--pmap]``  (needs ``pip install -e ".[examples]"`` for scikit-learn)
"""

from __future__ import annotations

import os
import sys

# Before JAX starts: 8 simulated devices (unless XLA_FLAGS names a count), and a longer wait for a collective's
# slowest device thread (8 device threads share the CPU cores; XLA:CPU's default of 40 s can be exceeded on a busy
# 2-core machine).
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    flags = "--xla_force_host_platform_device_count=8 --xla_cpu_collective_call_terminate_timeout_seconds=300"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".lstrip()

import jax  # the device count is fixed when JAX starts
import numpy as np
import optax
from flax import linen as nn
from sklearn.datasets import load_digits

from ember.data import ArrayDataset
from ember.training import DataParallel, Pmap, SingleDevice, TrainState, create_trainer

digits = load_digits()
x = (digits.data / 16.0).astype(np.float32)
y = digits.target.astype(np.int32)


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(nn.relu(nn.Dense(64)(x)))


def loss_fn(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()


def train(placement):
    state = TrainState.from_linen(MLP(), x[:2], optax.sgd(0.5), seed=0)
    data = ArrayDataset({"x": x, "y": y}, batch_size=64, shuffle=True, seed=0, drop_remainder=True)
    trainer = create_trainer(state, loss_fn, placement=placement)
    trainer.run(data, max_epochs=3)
    # Finish this run's device work before the next placement starts its own collectives: XLA:CPU can
    # deadlock when two multi-device programs interleave on the same device threads.
    jax.block_until_ready(trainer.state.train_state)
    return trainer.state


if __name__ == "__main__":
    print(f"{len(jax.devices())} devices: {jax.devices()[0].platform}")
    placements = [SingleDevice(), DataParallel(), *([Pmap()] if "--pmap" in sys.argv else [])]
    results = {p: train(p) for p in placements}
    reference = results[next(iter(results))].train_state.params
    for placement, state in results.items():
        pairs = zip(jax.tree.leaves(state.train_state.params), jax.tree.leaves(reference), strict=True)
        diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in pairs)
        print(f"{placement!r:<40} loss {float(state.output['loss']):.4f}  max |params - one device| {diff:.1e}")
        assert diff < 1e-4
