"""One process of tests/distributed/test_sharded_multiprocess.py.

``python sharded_script.py PID NPROC PORT WORKDIR``: trains with FSDP over every process's devices (4 CPU
devices in all) on the same global batches, with fused metrics and an orbax checkpoint that every process
writes and then restores into a new trainer; prints ``RESULT {json}``. NPROC=1 is the 1 x 4 reference.
"""

import json
import os
import sys

pid, nproc, port, workdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={4 // nproc}"

import jax  # noqa: E402

if nproc > 1:
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=nproc, process_id=pid)

import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import linen as nn  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ember import Events  # noqa: E402
from ember.checkpoint import OrbaxStore  # noqa: E402
from ember.data import ArrayDataset  # noqa: E402
from ember.handlers import Checkpoint, GradsHistHandler, WeightsHistHandler  # noqa: E402
from ember.metrics import Accuracy, Average  # noqa: E402
from ember.training import TrainState, create_trainer, fsdp  # noqa: E402
from ember.writers import TensorBoardWriter, histogram  # noqa: E402
from tests.training.models import batches  # noqa: E402

ARRAYS = {
    "x": np.concatenate([np.tile(b["x"], (1, 8)) for b in batches(4)]),
    "y": np.concatenate([b["y"] for b in batches(4)]),
}


class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Dropout(0.1, deterministic=not train)(nn.relu(nn.Dense(128)(x)))
        return nn.Dense(3)(nn.relu(nn.Dense(128)(x)))


def loss(model, batch):
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), {
        "y_pred": logits,
        "y": batch["y"],
    }


def new_trainer(extras=()):
    placement = fsdp(min_size=256)
    state = TrainState.from_linen(Net(), ARRAYS["x"][:2], optax.adam(1e-3), rngs=("dropout",), placement=placement)
    trainer = create_trainer(state, loss, placement=placement, extras=extras)
    Average(key="loss").attach(trainer, "loss")
    Accuracy().attach(trainer, "accuracy")
    return trainer


trainer = new_trainer(extras=("grads",))
tb = TensorBoardWriter(os.path.join(workdir, "tb"))  # histograms of state sharded across processes: process 0 writes
WeightsHistHandler(tb).attach(trainer, Events.EPOCH_COMPLETED)
GradsHistHandler(tb).attach(trainer, Events.EPOCH_COMPLETED)
data = ArrayDataset(ARRAYS, batch_size=16, shuffle=True, seed=3, drop_remainder=True)  # each process its part
store = OrbaxStore(os.path.join(workdir, "ckpt"))
Checkpoint({"trainer": trainer}, store, n_saved=2).attach(trainer, Events.EPOCH_COMPLETED)
state = trainer.run(data, max_epochs=3)
store.close()

params = trainer.state.train_state.params
kernel = params["Dense_1"]["kernel"]
held = sum(s.data.nbytes for leaf in jax.tree.leaves(params) for s in leaf.addressable_shards)
total = sum(leaf.nbytes for leaf in jax.tree.leaves(params))

again = new_trainer()
again_data = ArrayDataset(ARRAYS, batch_size=16, shuffle=True, seed=3, drop_remainder=True)
info = Checkpoint({"trainer": again}, OrbaxStore(os.path.join(workdir, "ckpt"))).resume()
restored_equal = all(
    bool(
        np.array_equal(
            multihost_utils.process_allgather(a, tiled=True), multihost_utils.process_allgather(b, tiled=True)
        )
    )
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again.state.train_state.params), strict=True)
)

calls = []  # a user's save handler (Ignite's signature): process 0 alone is called, with the whole arrays gathered
Checkpoint({"trainer": again}, lambda checkpoint, filename, metadata: calls.append((checkpoint, filename)))(again)
saved_kernel = [v for k, v in calls[0][0]["tree_state_dict"].items() if k == "params.Dense_1.kernel"] if calls else []
whole_kernel = np.asarray(multihost_utils.process_allgather(kernel, tiled=True))  # a collective: on every process

print(
    "RESULT "
    + json.dumps(
        {
            "params": [
                np.asarray(multihost_utils.process_allgather(x, tiled=True)).tolist() for x in jax.tree.leaves(params)
            ],
            "metrics": {k: float(v) for k, v in state.metrics.items()},
            "kernel_spec": str(kernel.sharding.spec),
            "held_fraction": held / total,
            "restored_step": info.step,
            "restored_equal": restored_equal,
            "checkpoints": sorted(p.name for p in store.root.iterdir()),
            "final_step": trainer.state.iteration,
            "user_saves": [filename for _, filename in calls],
            "user_saved_kernel_whole": bool(len(saved_kernel) == 1 and np.array_equal(saved_kernel[0], whole_kernel)),
            "kernel_histogram": [  # of the whole kernel, on the host, as tensorboardX would count it (the test's check)
                x.tolist()
                for x in histogram(np.asarray(multihost_utils.process_allgather(kernel, tiled=True))).trimmed()
            ],
        }
    ),
    flush=True,
)
