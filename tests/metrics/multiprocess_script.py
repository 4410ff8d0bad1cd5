"""One of two processes of tests/metrics/test_multiprocess.py: ``python multiprocess_script.py PID PORT FOLDER``."""

import json
import os
import sys
import time

import jax

pid, port, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2, process_id=pid)

import jax.numpy as jnp  # noqa: E402  # after jax.distributed.initialize
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import ember.checkpoint._msgpack as store_module  # noqa: E402
from ember import Engine, Events  # noqa: E402
from ember.checkpoint import CheckpointStore  # noqa: E402
from ember.errors import NotComputableError  # noqa: E402
from ember.handlers import Checkpoint  # noqa: E402
from ember.metrics import Accuracy, Average, ConfusionMatrix, RunningAverage, Sum  # noqa: E402
from ember.metrics._saved import encode_tree  # noqa: E402
from tests.metrics.ignite_style_metrics import CustomAccuracy  # noqa: E402

rng = np.random.default_rng(0)
scores = rng.normal(size=(40, 3)).astype(np.float32)
labels = rng.integers(0, 3, size=40)
mine = slice(0, 20) if pid == 0 else slice(20, 40)  # each process evaluates its own half
batches = [
    {"y_pred": jnp.asarray(scores[mine][i : i + 4]), "y": jnp.asarray(labels[mine][i : i + 4])} for i in range(0, 20, 4)
]
engine = Engine(lambda e, batch: batch)
Accuracy().attach(engine, "accuracy")
custom = CustomAccuracy()  # written Ignite's way: its counters summed over the processes by sync_all_reduce
custom.attach(engine, "custom")
ConfusionMatrix(3).attach(engine, "cm")
running = RunningAverage(output_transform=lambda out: jnp.mean(out["y_pred"]))
running.attach(engine, "running")
state = engine.run(batches)
out = {
    "accuracy": state.metrics["accuracy"],
    "cm": state.metrics["cm"].tolist(),
    "running_local": float(state.metrics["running"]),  # published every iteration: this process's value
    "running_global": running.compute(),  # a collective: the mean over processes
    "custom": state.metrics["custom"],
}
lonely = RunningAverage(output_transform=lambda out: out)  # only process 0 sees data: the mean is its value alone
lonely_engine = Engine(lambda e, batch: batch)
lonely.attach(lonely_engine, "lonely")
if pid == 0:  # process 1's engine has no data to run on
    lonely_engine.run([jnp.array(4.0), jnp.array(6.0)])
out["lonely_global"] = lonely.compute()
try:
    Sum().compute()  # no process updated it: every process says so, none waits for the others
except NotComputableError as e:
    out["nobody"] = str(e)
custom.reset()
custom.update((scores[mine], labels[mine]))
out["custom_saved"] = custom.state_dict()  # a collective: every process's own counters

total = Sum()
total.update(jnp.array([pid + 1.0]))
first = total.compute()
total.update(jnp.array([10.0]))
out["sum_twice"] = [first, total.compute()]
out["sum_local_after"] = float(total.state)

mesh = Mesh(np.array(jax.devices()), ("d",))
global_values = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), np.array([pid + 1.0], np.float32))
already_global = Sum()
already_global.update(global_values)
out["global_sum"] = already_global.compute()

# An epoch-wise metric checkpointed mid-epoch: each process's own part is saved and comes back to it.
values = [jnp.array([10.0 * (pid + 1) + i]) for i in range(6)]  # process 0: 10..15, process 1: 20..25


def averaging_engine():
    engine = Engine(lambda e, batch: batch)
    Average().attach(engine, "avg")
    return engine


straight_engine = averaging_engine()
out["straight_avg"] = straight_engine.run(values).metrics["avg"]
first = averaging_engine()
saver = Checkpoint({"engine": first}, folder, n_saved=None)  # process 0 writes, every process saves its part
saver.attach(first, Events.ITERATION_COMPLETED(once=3))
first.add_event_handler(Events.ITERATION_COMPLETED(once=3), lambda e: e.terminate())
if pid == 0:  # the writer is slow: the other process must still return only once the checkpoint is on disk
    real_write = store_module.write_leaves
    store_module.write_leaves = lambda f, leaves: time.sleep(2) or real_write(f, leaves)
first.run(values)
out["on_disk_when_run_returned"] = [c.step for c in CheckpointStore(folder).checkpoints()]
again = averaging_engine()
Checkpoint({"engine": again}, folder).resume()
out["resumed_avg"] = again.run(values).metrics["avg"]
manifest = CheckpointStore(folder).latest().manifest
out["saved_avg"] = manifest["metadata"]["state_dicts"]["engine"]["attached"]["metric:avg"]

# Saved by 3 processes, resumed on 2: process 0 takes the parts merged, the other none; the global value holds.
three = {"processes": [{"state": encode_tree(np.float32(k)), "updates": 1} for k in (1.0, 2.0, 3.0)]}
total = Sum()
total.load_state_dict(three)
out["three_on_two"] = {"local": float(np.asarray(total.state)), "global": total.compute()}
print("RESULT " + json.dumps(out), flush=True)
jax.distributed.shutdown()
