"""Memory during a resume, on 8 simulated CPU devices: ``python resume_memory_script.py MODE FOLDER``.

An FSDP train state (two 1536 x 1536 matrices with Adam: about 57 MB, a quarter of it on no device) is restored:

- ``ember``: saved with each store, then restored by ``Checkpoint.resume()`` into a new trainer, once per store;
- ``orbax``: restored by orbax itself into abstract shapes and shardings, the reference for host memory.

Device bytes are the live arrays' bytes per device, counted from their shardings (nothing is fetched) at the points
where restored arrays come into existence (when the store's read returns, and when the trainer places the state),
less what the process held before the resume, plus the resumed trainer's own state: the trainer's peak.
Host bytes are the growth of the process's peak resident memory over the resume (Linux's ``VmHWM``, reset first).
Prints ``RESULT {json}``.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"
mode, folder = sys.argv[1], sys.argv[2]

import gc  # noqa: E402
from collections import defaultdict  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from ember.checkpoint import CheckpointStore, OrbaxStore  # noqa: E402
from ember.handlers import Checkpoint  # noqa: E402
from ember.training import TrainState, create_trainer, fsdp  # noqa: E402

N = 1536


def new_trainer():
    params = {"w0": jnp.full((N, N), 0.5, jnp.float32), "w1": jnp.full((N, N), 0.25, jnp.float32)}
    state = TrainState.create(lambda p, x: x @ p["w0"] @ p["w1"], params, optax.adam(0.1))
    return create_trainer(state, lambda m, b: jnp.mean(m(b) ** 2), placement=fsdp(min_size=1024))


def most_on_one_device() -> int:
    """The largest total of live array bytes on any one device (from shardings: no array is created or read)."""
    per_device: dict[str, int] = defaultdict(int)
    for a in jax.live_arrays():
        each = int(np.prod(a.sharding.shard_shape(a.shape))) * a.dtype.itemsize
        for d in a.sharding.device_set:
            per_device[str(d)] += each
    return max(per_device.values(), default=0)


def status(key: str) -> int:
    """A field of /proc/self/status, in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def host_growth(resume) -> int:
    """How far the peak resident memory rose above the current one while ``resume()`` ran."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from the current resident size
    before = status("VmRSS:")
    resume()
    return status("VmHWM:") - before


def measured_resume(store) -> dict:
    """Resume a new trainer from ``store``; its peak bytes on one device count what it held before, once."""
    trainer = new_trainer()
    gc.collect()
    baseline = most_on_one_device()  # the new trainer's own state and whatever else this process holds
    peaks = []
    read, put = store.format.read, trainer.placement.put_state

    def counted_read(*args, **kwargs):
        out = read(*args, **kwargs)
        peaks.append(most_on_one_device())
        return out

    def counted_put(state):
        out = put(state)
        peaks.append(most_on_one_device())
        return out

    store.format.read, trainer.placement.put_state = counted_read, counted_put
    saver = Checkpoint({"trainer": trainer}, store)
    host = host_growth(saver.resume)
    restored = float(trainer.state.train_state.params["w1"][0, 0])
    own = sum(
        int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize
        for x in jax.tree.leaves(trainer.state.train_state)
    )
    return {"device_peak": max(peaks) - baseline + own, "host_growth": host, "restored": restored}


leaves = jax.tree.leaves(new_trainer().state.train_state)
result = {
    "state_bytes": sum(x.nbytes for x in leaves),
    "per_device_state": sum(int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize for x in leaves),
}
del leaves
if mode == "ember":
    saved = new_trainer()
    saved.state.train_state = saved.state.train_state.replace(
        params={**saved.state.train_state.params, "w1": saved.state.train_state.params["w1"] * 2}
    )
    for name, kind in (("orbax", OrbaxStore), ("msgpack", CheckpointStore)):
        Checkpoint({"trainer": saved}, kind(os.path.join(folder, name))).save_now(saved)
    del saved
    for name, kind in (("orbax", OrbaxStore), ("msgpack", CheckpointStore)):
        result[name] = measured_resume(kind(os.path.join(folder, name)))
else:  # orbax alone, into abstract shapes, with the live state dropped first (the best it can do)
    import orbax.checkpoint as ocp

    trainer = new_trainer()
    abstract = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in trainer.tree_state_dict().items()
    }
    trainer.state.train_state = None
    path = OrbaxStore(os.path.join(folder, "orbax")).latest().path / "state"
    checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler())
    result["host_growth"] = host_growth(
        lambda: checkpointer.restore(path, args=ocp.args.StandardRestore({"trainer": abstract}))
    )
print("RESULT " + json.dumps(result), flush=True)
