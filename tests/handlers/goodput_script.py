"""A run with a GoodputLedger, killed once: run by tests/handlers/test_goodput.py.

``python goodput_script.py RUN_DIR [kill] [every-iteration]``: 12 iterations of a small model, a checkpoint every
3, the ledger writing its record with each checkpoint and on its timer (10 s: not within this run), or every
iteration; with ``kill`` the process SIGKILLs itself at iteration 8. Without, it resumes from the latest checkpoint
and finishes.
"""

import os
import signal
import sys

import jax.numpy as jnp
import numpy as np
import optax

from ember import Events
from ember.handlers import Checkpoint, GoodputLedger
from ember.training import TrainState, create_trainer

run_dir = sys.argv[1]
state = TrainState.create(lambda p, x: x @ p, jnp.zeros((4, 1)), optax.sgd(0.1))
trainer = create_trainer(state, lambda m, x: jnp.mean((m(x) - 1.0) ** 2))
saver = Checkpoint({"trainer": trainer}, os.path.join(run_dir, "ckpt"), n_saved=2)
GoodputLedger(run_dir, flush_every=0 if "every-iteration" in sys.argv[2:] else 10.0).attach(
    trainer, checkpoints=[saver]
)
saver.attach(trainer, Events.ITERATION_COMPLETED(every=3))
if "kill" in sys.argv[2:]:
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=8), lambda: os.kill(os.getpid(), signal.SIGKILL))
saver.resume()
trainer.run([np.ones((2, 4), np.float32)] * 12)
