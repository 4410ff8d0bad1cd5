"""Saves checkpoints in a loop until killed: ``python kill_script.py FOLDER STORE``.

Checkpoint ``k`` holds arrays filled with ``k`` (about 24 MB, so a kill often lands inside a write), in
the background, one after another, with retention. Each step is written, its manifest amended, then written
again with other arrays replacing it (``version`` 1, values ``k + 0.5``), as a ``Checkpoint`` does when a state
changes after a save of the same step. ``STORE`` is ``msgpack`` or ``orbax``. The test kills it with SIGKILL at
a random moment.
"""

import sys

import numpy as np

from ember.checkpoint import CheckpointStore, OrbaxStore

store = (OrbaxStore if sys.argv[2] == "orbax" else CheckpointStore)(sys.argv[1])
start = (store.latest().step + 1) if store.latest() is not None else 1
for step in range(start, start + 10_000):
    name = f"step_{step:08d}"
    for version in (0, 1):
        value = step + 0.5 * version
        tree = {"w": np.full((3, 1 << 20), value, np.float64), "b": np.full(7, step, np.int32), "step": step}
        store.save_in_background(
            tree, step=step, metrics={"loss": 1.0 / step}, metadata={"version": version}, replaces=name
        )
        if version == 0:
            store.amend_in_background(name, metadata={"version": 0, "amended": True})
    store.prune(keep_latest=2)
    print(f"started {step}", flush=True)
