"""Saves checkpoints in a loop until killed: ``python kill_script.py FOLDER``.

Checkpoint ``k`` holds arrays filled with ``k`` (about 24 MB, so a kill often lands inside a write), in
the background, one after another, with retention. The test kills it with SIGKILL at a random moment.
"""

import sys

import numpy as np

from ember.checkpoint import CheckpointStore

store = CheckpointStore(sys.argv[1])
start = (store.latest().step + 1) if store.latest() is not None else 1
for step in range(start, start + 10_000):
    tree = {"w": np.full((3, 1 << 20), step, np.float64), "b": np.full(7, step, np.int32), "step": step}
    store.save_in_background(tree, step=step, metrics={"loss": 1.0 / step})
    store.prune(keep_latest=2)
    print(f"started {step}", flush=True)
