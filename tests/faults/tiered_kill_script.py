"""Trains with checkpoints in a TieredStore until killed: ``python tiered_kill_script.py FOLDER``.

A small model trains for 160 iterations with a ``Checkpoint`` (``n_saved=1``, background writes, the default) saving
every iteration into ``TieredStore(FOLDER/fast, FOLDER/durable, durable_every=5)``, resuming from it first. It prints
``resumed STEP DIGEST`` (``resumed 0 -`` on a fresh start), then ``step N DIGEST`` after each iteration and ``done
DIGEST`` at the end, DIGEST being a SHA-256 of the whole train state. The test kills it with SIGKILL at random points.
"""

import hashlib
import sys

import jax
import numpy as np
import optax

from ember import Events
from ember.checkpoint import TieredStore
from ember.data import ArrayDataset
from ember.handlers import Checkpoint
from ember.training import TrainState, create_trainer
from tests.training.models import LinenNet, batches, classification_loss

folder = sys.argv[1]
arrays = {k: np.concatenate([b[k] for b in batches(4)]) for k in ("x", "y")}
data = ArrayDataset(arrays, batch_size=16, shuffle=True, seed=1, drop_remainder=True)
state = TrainState.from_linen(LinenNet(), arrays["x"][:2], optax.adam(1e-2), seed=0, rngs=("dropout",))
trainer = create_trainer(state, classification_loss)


def digest(engine):
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(engine.state.train_state):
        h.update(np.asarray(leaf).tobytes())
    return h.hexdigest()[:16]


saver = Checkpoint({"trainer": trainer}, TieredStore(f"{folder}/fast", f"{folder}/durable", durable_every=5), n_saved=1)
saver.attach(trainer, Events.ITERATION_COMPLETED)
info = saver.resume()
print(f"resumed {info.step} {digest(trainer)}" if info is not None else "resumed 0 -", flush=True)
trainer.add_event_handler(
    Events.ITERATION_COMPLETED, lambda e: print(f"step {e.state.iteration} {digest(e)}", flush=True)
)
trainer.run(data, max_epochs=40)
print(f"done {digest(trainer)}", flush=True)
