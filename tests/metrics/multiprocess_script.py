"""One of two processes of tests/metrics/test_multiprocess.py: ``python multiprocess_script.py PID PORT``."""

import json
import os
import sys

import jax

pid, port = int(sys.argv[1]), sys.argv[2]
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2, process_id=pid)

import jax.numpy as jnp  # noqa: E402  # after jax.distributed.initialize
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ember import Engine  # noqa: E402
from ember.metrics import Accuracy, ConfusionMatrix, RunningAverage, Sum  # noqa: E402

rng = np.random.default_rng(0)
scores = rng.normal(size=(40, 3)).astype(np.float32)
labels = rng.integers(0, 3, size=40)
mine = slice(0, 20) if pid == 0 else slice(20, 40)  # each process evaluates its own half
batches = [
    {"y_pred": jnp.asarray(scores[mine][i : i + 4]), "y": jnp.asarray(labels[mine][i : i + 4])} for i in range(0, 20, 4)
]
engine = Engine(lambda e, batch: batch)
Accuracy().attach(engine, "accuracy")
ConfusionMatrix(3).attach(engine, "cm")
running = RunningAverage(output_transform=lambda out: jnp.mean(out["y_pred"]))
running.attach(engine, "running")
state = engine.run(batches)
out = {
    "accuracy": state.metrics["accuracy"],
    "cm": state.metrics["cm"].tolist(),
    "running_local": float(state.metrics["running"]),  # published every iteration: this process's value
    "running_global": running.compute(),  # a collective: the mean over processes
}

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
print("RESULT " + json.dumps(out), flush=True)
jax.distributed.shutdown()
