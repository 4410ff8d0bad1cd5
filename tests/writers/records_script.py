"""A library run's record, SIGKILLed once and relaunched: run by tests/writers/test_library_records.py.

``python records_script.py RUN_DIR [KILL_AT]``: 24 iterations of a small model logged every 2 to JSONL, CSV and
TensorBoard through ``create_run_writer``, a checkpoint every 5 (in the background, the default) with the writer
synced before each; with ``KILL_AT`` the process SIGKILLs itself once iteration KILL_AT is done. A relaunch
resumes from the latest checkpoint and tells the writer where it resumed (``resume_at``), as a user's script does.
"""

import os
import signal
import sys

import jax.numpy as jnp
import numpy as np
import optax

from ember import Events
from ember.handlers import Checkpoint, ScalarLogger
from ember.training import TrainState, create_trainer
from ember.writers import create_run_writer

run_dir = sys.argv[1]
state = TrainState.create(lambda p, x: x @ p, jnp.zeros((4, 1)), optax.sgd(0.05))
trainer = create_trainer(state, lambda model, x: jnp.mean((model(x) - 1.0) ** 2))
writer = create_run_writer(run_dir, ["jsonl", "csv", "tensorboard"])
ScalarLogger(writer, tag="train", output_keys=["loss"]).attach(trainer, Events.ITERATION_COMPLETED(every=2))
trainer.add_event_handler(Events.ITERATION_COMPLETED(every=5), writer.sync)  # the records first, then the save
saver = Checkpoint({"trainer": trainer}, os.path.join(run_dir, "checkpoints"), n_saved=2)
saver.attach(trainer, Events.ITERATION_COMPLETED(every=5))
if len(sys.argv) > 2:
    kill = int(sys.argv[2])
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=kill), lambda: os.kill(os.getpid(), signal.SIGKILL))
info = saver.resume()
writer.resume_at(info.step if info is not None else 0)  # drop what a killed launch logged past its checkpoint
with writer:
    trainer.run([np.full((2, 4), i, np.float32) for i in (0.5, 1.0, 1.5)], max_epochs=8)
saver.store.close()
