"""Checkpoint speed: a train state of ~100 M float32 parameters with Adam (~1.2 GB), in one process.

Measured, each the median of ``--repeats`` runs:

- ``d2h``: the device-to-host copy a save must make: ``jax.device_get`` of the whole train state into
  host buffers allocated beforehand (on the CPU backend ``device_get`` returns views, so this is a
  memcpy there);
- ``blocked``: how long ``CheckpointStore.save_in_background`` keeps the training thread, after a first
  save has allocated the store's reusable host buffers (target: at most 1.2 x d2h); each save gets a
  fresh copy of the state, since a device array keeps its host value once fetched; also with
  ``device_snapshot=True``;
- ``write``: from the call to the checkpoint being on disk (``wait()``), against fetching the same state
  and writing its bytes raw with NumPy (``ndarray.tofile`` + fsync) into the same folder (target: at
  least 0.7 x raw bandwidth);
- ``restore``: ``CheckpointStore.restore(target=...)``, verified (CRC-32) and rebuilt into the structure;
- ``fast tier``: a save into a ``TieredStore``'s fast tier (``--fast``, ``/dev/shm`` by default) that is not due in
  the durable tier: the training thread blocked, and the call to on disk, against the durable store's above;
- ``training slowdown``: a trainer taking Adam steps on the same state, with the ``Checkpoint`` handler
  saving in the background every ``--every`` steps, against the same run without it (target: at most 5%),
  with the default host copy and with ``device_snapshot=True``. With ``--batch 0`` (the default) the
  step's gradient touches one row per matrix, so a step is mostly the Adam update (enough work for a
  CPU); ``--batch B`` makes it a forward and backward pass of ``B`` rows through every matrix (about
  6 x B x parameters FLOPs), a step the size of a real model's on an accelerator.

Run: ``python benchmarks/checkpoint.py [--params N] [--repeats R] [--steps S] [--every E] [--batch B]
[--dir PATH] [--fast PATH]``; ``--quick`` uses a small state (a smoke run, not a measurement).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _runs import timed_runs

from ember import Events
from ember.checkpoint import CheckpointStore, TieredStore
from ember.handlers import Checkpoint
from ember.training import TrainState, create_trainer

WIDTH = 4096  # parameters are (WIDTH, WIDTH) matrices: 16.8 M float32 each


def make_state(n_params: int) -> TrainState:
    rows = max(1, n_params // WIDTH)
    blocks = max(1, rows // WIDTH)
    params = {f"layer_{i}": jnp.full((rows // blocks, WIDTH), 0.01 * (i + 1), jnp.float32) for i in range(blocks)}
    return TrainState.create(apply, params, optax.adam(1e-3))


def apply(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """A vector ``x`` touches one row of each matrix; a batch ``(B, WIDTH)`` goes through all of them."""
    if x.ndim == 1:
        return sum(jnp.sum(w[:1] * x) for w in params.values())  # type: ignore[return-value]
    return sum(jnp.mean(jnp.tanh(x @ w.T)) for w in params.values())  # type: ignore[return-value]


def loss_fn(model: Any, batch: Any) -> Any:
    return model(batch) ** 2


def nbytes(tree: Any) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def raw_write(tree: Any, folder: Path) -> None:
    with open(folder / "raw.bin", "wb") as f:
        for leaf in jax.tree.leaves(jax.device_get(tree)):
            np.asarray(leaf).tofile(f)
        f.flush()
        os.fsync(f.fileno())


def d2h_copy(tree: Any, buffers: list[np.ndarray]) -> None:
    for leaf, buffer in zip(jax.tree.leaves(jax.device_get(tree)), buffers, strict=True):
        np.copyto(buffer, np.asarray(leaf))


def fresh(tree: Any) -> Any:
    """A copy of ``tree`` in new device buffers: a device array caches its host value once fetched."""
    return jax.block_until_ready(jax.tree.map(jnp.copy, tree))


def measure_store(state: TrainState, root: Path, fast: Path, repeats: int) -> dict[str, list[float]]:
    tree = {"trainer": state}
    measures = ("d2h", "blocked", "write", "raw", "restore", "snap", "snap_write", "fast", "fast_write")
    out: dict[str, list[float]] = {k: [] for k in measures}
    buffers = [np.empty(x.shape, x.dtype) for x in jax.tree.leaves(tree)]
    stores: dict[str, CheckpointStore] = {
        "host": CheckpointStore(root / "store"),
        "snap": CheckpointStore(root / "snap", device_snapshot=True),
        "fast": TieredStore(fast, root / "tiered", durable_every=1_000_000),  # every save: the fast tier only
    }
    for store in stores.values():  # allocates the host buffers and compiles the device copy, as a first save does
        store.save_in_background(fresh(tree), step=0)
        store.delete(store.wait())  # type: ignore[arg-type]
    for r in range(1, repeats + 1):
        source = fresh(tree)
        out["d2h"].append(timed(lambda s=source: d2h_copy(s, buffers)))
        for key, store in stores.items():
            source = fresh(tree)
            start = time.perf_counter()
            store.save_in_background(source, step=r)
            out["blocked" if key == "host" else key].append(time.perf_counter() - start)
            store.wait()
            out["write" if key == "host" else f"{key}_write"].append(time.perf_counter() - start)
        raw_dir = root / f"raw_{r}"
        raw_dir.mkdir()
        source = fresh(tree)  # the raw write fetches the state from the device too, as a save does
        out["raw"].append(timed(lambda d=raw_dir, s=source: raw_write(s, d)))
        out["restore"].append(timed(lambda h=stores["host"]: h.restore(target=tree, checkpoint=h.latest())))
        shutil.rmtree(raw_dir)
        for store in stores.values():
            store.delete(store.latest())  # type: ignore[arg-type]
    return out


def measure_training(
    state: TrainState, root: Path, steps: int, every: int, repeats: int, batch_rows: int
) -> tuple[dict[str, list[float]], list[float]]:
    """Per repeat: run time with background saves every ``every`` steps over run time without; step times.

    Saves go through a host copy (the default) or a device snapshot (``device_snapshot=True``). The run
    ends when the last save is on disk (COMPLETED waits for it), so the last save should come a few steps
    before the end, as it does in a real run: ``steps`` not a multiple of ``every``.
    """
    shape = (batch_rows, WIDTH) if batch_rows else (WIDTH,)
    batch = jax.random.normal(jax.random.key(0), shape, jnp.float32) / WIDTH**0.5
    data = [batch] * steps
    initial = jax.device_get(state)  # each trainer donates its state: every run starts from this host copy
    trainers = {key: create_trainer(initial, loss_fn) for key in ("plain", "host", "snap")}
    savers = []
    for key in ("host", "snap"):
        store = CheckpointStore(root / f"train_{key}", device_snapshot=key == "snap")
        savers.append(Checkpoint({"trainer": trainers[key]}, store, n_saved=1))
        savers[-1].attach(trainers[key], Events.ITERATION_COMPLETED(every=every))
    for trainer in trainers.values():  # compile outside the timing
        trainer.run(data[:1])
    runs = {key: timed_runs(trainer, initial) for key, trainer in trainers.items()}
    ratios: dict[str, list[float]] = {"host": [], "snap": []}
    step_times = []
    for _ in range(repeats):
        times = {}
        for key, run in runs.items():
            times[key] = run(data)  # COMPLETED waits for the last save to be on disk
        for key in ratios:
            ratios[key].append(times[key] / times["plain"])
        step_times.append(times["plain"] / steps)
        for saver in savers:  # the next repeat saves the same steps again
            for info in saver.store.checkpoints():
                saver.store.delete(info)
    return ratios, step_times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=100_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--batch", type=int, default=0, help="rows per step through every matrix (0: one row)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder)")
    parser.add_argument("--fast", type=Path, default=None, help="the fast tier's folder (default: in /dev/shm)")
    parser.add_argument("--quick", action="store_true", help="a small state: a smoke run, not a measurement")
    args = parser.parse_args()
    if args.quick:
        args.params, args.repeats, args.steps, args.every = 2_000_000, 1, 4, 2
    root = Path(tempfile.mkdtemp(dir=args.dir, prefix="ember-bench-"))
    shm = Path("/dev/shm")
    in_memory = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    fast = Path(tempfile.mkdtemp(dir=args.fast or in_memory or root, prefix="ember-bench-fast-"))
    try:
        state = make_state(args.params)
        n = sum(x.size for x in jax.tree.leaves(state.params))
        size = nbytes(state)
        dev = jax.devices()[0]
        print(f"python {platform.python_version()}, jax {jax.__version__} on {dev.platform} ({dev.device_kind})")
        print(f"train state: {n / 1e6:.1f} M float32 parameters with Adam, {size / 1e9:.2f} GB; folder {root}")
        store = measure_store(state, root, fast, args.repeats)
        med = {k: statistics.median(v) for k, v in store.items()}
        gbps = {k: size / med[k] / 1e9 for k in ("write", "raw", "restore")}
        print(f"  d2h copy            {med['d2h']:8.3f} s")
        print(f"  blocked per save    {med['blocked']:8.3f} s  {med['blocked'] / med['d2h']:.2f} x d2h (target <= 1.2)")
        print(
            f"  write to disk       {med['write']:8.3f} s  {gbps['write']:.2f} GB/s, "
            f"{gbps['write'] / gbps['raw']:.2f} x raw ({gbps['raw']:.2f} GB/s; target >= 0.7)"
        )
        print(f"  restore (verified)  {med['restore']:8.3f} s  {gbps['restore']:.2f} GB/s")
        print(f"  device_snapshot=True: blocked {med['snap']:.3f} s, call to on disk {med['snap_write']:.3f} s")
        print(
            f"  fast tier ({fast.parent}): blocked {med['fast']:.3f} s ({med['fast'] / med['blocked']:.2f} x the "
            f"durable save's), call to on disk {med['fast_write']:.3f} s ({med['fast_write'] / med['write']:.2f} x)"
        )
        ratios, step_times = measure_training(state, root, args.steps, args.every, args.repeats, args.batch)
        print(
            f"  training (batch {args.batch}, {statistics.median(step_times):.3f} s/step), a background save "
            f"every {args.every} of {args.steps} steps, time over the time without (target <= 1.05):"
        )
        for key, label in (("host", "host copy (default)"), ("snap", "device_snapshot=True")):
            r = ratios[key]
            print(f"    {label:<22} {statistics.median(r):.3f} x (median; range {min(r):.3f}-{max(r):.3f})")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(fast, ignore_errors=True)


if __name__ == "__main__":
    main()
