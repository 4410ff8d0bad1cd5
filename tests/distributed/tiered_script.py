"""One process of tests/distributed/test_tiered_multiprocess.py.

``python tiered_script.py PID NPROC PORT WORKDIR MODE``: 2 processes x 2 CPU devices train with FSDP (each process
holds its own shards) and a ``Checkpoint`` (``n_saved=1``, background) saving every iteration into
``TieredStore(WORKDIR/fast, OrbaxStore(WORKDIR/durable), durable_every=3)``.

- ``train``: 7 iterations, then, with the last save on disk, both processes end abruptly (``os._exit``: no COMPLETED,
  so the last save stays in the fast tier). RESULT: each iteration's digest of this process's shards.
- ``resume``: a new trainer resumes. RESULT: the step, the tier it came from, and the digest of its shards.
"""

import hashlib
import json
import os
import sys
import time

pid, nproc, port, workdir, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"

import jax  # noqa: E402

jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=nproc, process_id=pid)

import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import linen as nn  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ember import Events  # noqa: E402
from ember.checkpoint import OrbaxStore, TieredStore  # noqa: E402
from ember.data import ArrayDataset  # noqa: E402
from ember.handlers import Checkpoint  # noqa: E402
from ember.training import TrainState, create_trainer, fsdp  # noqa: E402
from tests.training.models import batches  # noqa: E402

ARRAYS = {
    "x": np.concatenate([np.tile(b["x"], (1, 8)) for b in batches(4)]),
    "y": np.concatenate([b["y"] for b in batches(4)]),
}


class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        return nn.Dense(3)(nn.relu(nn.Dense(128)(x)))


def loss(model, batch):
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), {}


def digest(engine):
    """This process's shards of the train state (each distinct shard once)."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(engine.state.train_state):
        for shard in sorted(leaf.addressable_shards, key=lambda s: str(s.index)):
            h.update(str(shard.index).encode() + np.asarray(shard.data).tobytes())
    return h.hexdigest()[:16]


placement = fsdp(min_size=256)
state = TrainState.from_linen(Net(), ARRAYS["x"][:2], optax.adam(1e-3), placement=placement)
trainer = create_trainer(state, loss, placement=placement)
store = TieredStore(os.path.join(workdir, "fast"), OrbaxStore(os.path.join(workdir, "durable")), durable_every=3)
saver = Checkpoint({"trainer": trainer}, store, n_saved=1)
saver.attach(trainer, Events.ITERATION_COMPLETED)
held = [s.data.size for leaf in jax.tree.leaves(state.params) for s in leaf.addressable_shards]

if mode == "train":
    digests = {}

    @trainer.on(Events.ITERATION_COMPLETED)
    def record(engine):
        digests[engine.state.iteration] = digest(engine)
        if engine.state.iteration == 7:
            saver.wait()
            multihost_utils.sync_global_devices("saved")
            print("RESULT " + json.dumps({"digests": digests, "held": held}), flush=True)
            time.sleep(0.5 if pid == 0 else 0.0)  # process 0 hosts the coordination service: it goes last
            os._exit(0)

    trainer.run(ArrayDataset(ARRAYS, batch_size=16, shuffle=True, seed=3, drop_remainder=True), max_epochs=3)
else:
    info = saver.resume()
    tier = "fast" if store.fast.holds(info) else "durable"
    print("RESULT " + json.dumps({"step": info.step, "tier": tier, "digest": digest(trainer)}), flush=True)
    store.close()
