"""One process of tests/distributed/test_stall.py.

``python stall_script.py PID PORT WORKDIR``: 2 processes x 2 CPU devices train one data-parallel model, each with a
StallWatchdog writing into WORKDIR/run. At its third iteration process 0 runs a handler that sleeps for two
minutes; process 1 goes on into the fourth step and waits there for process 0 in the step's collective. Process 1's
watchdog (step_timeout 3 s) ends it first; process 0's (6 s) ends the sleeper. Process 0 is the sleeper because it
hosts JAX's coordination service: were it to exit first, the runtime would abort process 1 before its watchdog acts.
"""

import os
import sys
import time

pid, port, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"

import jax  # noqa: E402

jax.config.update("jax_enable_recoverability", True)  # a peer's exit does not abort this process
jax.distributed.initialize(
    coordinator_address=f"localhost:{port}", num_processes=2, process_id=pid, heartbeat_timeout_seconds=30
)

import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ember import Events  # noqa: E402
from ember.data import ArrayDataset  # noqa: E402
from ember.handlers import StallWatchdog  # noqa: E402
from ember.training import DataParallel, TrainState, create_trainer  # noqa: E402
from tests.training.models import LinenNet, batches, classification_loss  # noqa: E402

ARRAYS = {"x": np.concatenate([b["x"] for b in batches(4)]), "y": np.concatenate([b["y"] for b in batches(4)])}
placement = DataParallel()
state = TrainState.from_linen(LinenNet(), ARRAYS["x"][:2], optax.sgd(0.1), rngs=("dropout",), placement=placement)
trainer = create_trainer(state, classification_loss, placement=placement)
data = ArrayDataset(ARRAYS, batch_size=16, shuffle=True, seed=3, drop_remainder=True)


def sleepy(engine):
    print(f"SLEEPING {time.time()}", flush=True)
    time.sleep(120)


if pid == 0:
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=3), sleepy)
step_timeout = 6.0 if pid == 0 else 3.0
StallWatchdog(os.path.join(workdir, "run"), step_timeout=step_timeout, startup_timeout=120.0).attach(trainer)
trainer.run(data, max_epochs=3)
print("the run was not stopped", flush=True)
