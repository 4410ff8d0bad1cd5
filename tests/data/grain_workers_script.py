"""A GrainPipeline with 2 worker processes: ``python grain_workers_script.py MODE``.

- ``run``: an engine runs one pass, and the process ends;
- ``loop``: a loop reads three batches and leaves the iterator open at the end;
- ``keep``: an engine runs one pass and its last batch (``state.batch``) is kept until the process ends;
- ``kill``: at iteration 2 it prints ``children PID ...`` (its worker processes and Grain's helpers, from /proc) and
  waits to be killed.
"""

import os
import sys
import time

import numpy as np

from ember import Engine, Events
from ember.data import GrainPipeline


def scale(x):
    return {"x": np.full((64,), x, np.float32)}


def children(pid: int) -> list[int]:
    """Every descendant of ``pid``, from /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, frontier = [], [pid]
    while frontier:
        kids = [p for p, parent in parents.items() if parent in frontier]
        found += kids
        frontier = kids
    return sorted(found)


if __name__ == "__main__":
    mode = sys.argv[1]
    pipeline = GrainPipeline(np.arange(200), batch_size=8, transforms=[scale], worker_count=2)
    if mode == "loop":
        it = iter(pipeline)
        batches = [next(it) for _ in range(3)]
    else:
        engine = Engine(lambda e, batch: batch)
        if mode == "kill":

            @engine.on(Events.ITERATION_COMPLETED(once=2))
            def wait_to_be_killed(_):
                print("children " + " ".join(map(str, children(os.getpid()))), flush=True)
                time.sleep(600)

        engine.run(pipeline, max_epochs=1)
        kept = engine.state.batch if mode == "keep" else None
    print("done", flush=True)
