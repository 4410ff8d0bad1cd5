"""One process of tests/distributed/test_lost_process.py.

``python lost_process_script.py PID PORT WORKDIR [kill] [fsdp]``: 2 processes x 2 CPU devices train one
data-parallel model with a checkpoint every 2 iterations and a ``ProcessWatchdog``; with ``fsdp``, its state
sharded over the 4 devices (checkpoints with orbax); with ``kill``, process 1 SIGKILLs itself at iteration 5.
A run that completes prints ``RESULT {json}``.
"""

import json
import os
import signal
import sys
import time

pid, port, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
kill, sharded = "kill" in sys.argv[4:], "fsdp" in sys.argv[4:]
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"

import jax  # noqa: E402

jax.config.update("jax_enable_recoverability", True)  # the watchdog, not the runtime, ends a survivor
jax.distributed.initialize(
    coordinator_address=f"localhost:{port}", num_processes=2, process_id=pid, heartbeat_timeout_seconds=5
)

import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ember import Events  # noqa: E402
from ember.checkpoint import OrbaxStore  # noqa: E402
from ember.data import ArrayDataset  # noqa: E402
from ember.handlers import Checkpoint, ProcessWatchdog  # noqa: E402
from ember.training import DataParallel, TrainState, create_trainer, fsdp  # noqa: E402
from tests.training.models import LinenNet, batches, classification_loss  # noqa: E402

ARRAYS = {"x": np.concatenate([b["x"] for b in batches(4)]), "y": np.concatenate([b["y"] for b in batches(4)])}
placement = fsdp(min_size=16) if sharded else DataParallel()
state = TrainState.from_linen(
    LinenNet(), ARRAYS["x"][:2], optax.sgd(0.1), seed=0, rngs=("dropout",), placement=placement
)
trainer = create_trainer(state, classification_loss, placement=placement)
data = ArrayDataset(ARRAYS, batch_size=16, shuffle=True, seed=3, drop_remainder=True)
folder = os.path.join(workdir, "ckpt")
saver = Checkpoint({"trainer": trainer}, OrbaxStore(folder) if sharded else folder, n_saved=2)  # background saves
saver.attach(trainer, Events.ITERATION_COMPLETED(every=2))
ProcessWatchdog(saver, poll_every=0.5).attach(trainer)
if kill and pid == 1:
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=5), lambda: os.kill(os.getpid(), signal.SIGKILL))
info = saver.resume()
trainer.run(data, max_epochs=3)
params = [
    np.asarray(multihost_utils.process_allgather(x, tiled=True)).tolist()
    for x in jax.tree.leaves(trainer.state.train_state.params)
]
print("RESULT " + json.dumps({"resumed_from": None if info is None else info.step, "params": params}), flush=True)
# With recoverability on, JAX's shutdown no longer waits for every process (its own warning says so): end
# together, the coordinator (process 0) last, and skip the runtime's shutdown call.
multihost_utils.sync_global_devices("ember-test-end")
if pid == 0:
    time.sleep(1.0)
os._exit(0)
