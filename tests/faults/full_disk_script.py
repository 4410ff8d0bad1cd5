"""A run whose checkpoint folder fills up: ``python full_disk_script.py STORE ON_ERROR FOLDER``.

``FOLDER`` is a 1 MiB file system of its own (tests/faults/test_full_disk.py mounts a tmpfs there). Every iteration
saves 256 KB of random float32 (incompressible) in the background, as ``Checkpoint`` does by default, and keeps
them all: the fourth save no longer fits. Prints ``RESULT {json}`` with what the run did and what is on disk.
"""

import json
import os
import sys
import warnings

store_kind, on_error, folder = sys.argv[1], sys.argv[2], sys.argv[3]

import jax  # noqa: E402
import numpy as np  # noqa: E402

from ember import Engine, Events  # noqa: E402
from ember.checkpoint import CheckpointStore, OrbaxStore  # noqa: E402
from ember.handlers import Checkpoint  # noqa: E402


class Weights:
    """256 KB of random values that change every iteration (a train state, as far as a checkpoint can tell)."""

    def __init__(self, engine):
        self.engine = engine

    def tree_state_dict(self):
        key = jax.random.key(self.engine.state.iteration)
        return {"w": jax.random.uniform(key, (65_536,))}

    def load_tree_state_dict(self, tree):
        self.loaded = tree


trainer = Engine(lambda e, b: b)
store = (OrbaxStore if store_kind == "orbax" else CheckpointStore)(folder)
saver = Checkpoint({"trainer": trainer, "weights": Weights(trainer)}, store, n_saved=None, on_error=on_error)
saver.attach(trainer, Events.ITERATION_COMPLETED)
seen = []
trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(e.state.iteration))
result = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        trainer.run(range(8))
    except OSError as e:
        result["raised"] = {"type": type(e).__name__, "errno": e.errno, "message": str(e)}
result["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
result["iterations"] = seen
result["checkpoints"] = [c.step for c in store.checkpoints()]
result["on_disk"] = sorted(os.listdir(folder))
latest = store.latest()
weights = Weights(trainer)
Checkpoint({"trainer": Engine(lambda e, b: b), "weights": weights}, store).resume()
expected = np.asarray(jax.random.uniform(jax.random.key(latest.step), (65_536,)))
result["restored_latest_intact"] = bool(np.array_equal(np.asarray(weights.loaded["w"]), expected))
getattr(store, "close", lambda: None)()
print("RESULT " + json.dumps(result), flush=True)
