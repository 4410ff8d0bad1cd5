"""Checkpoint speed: a train state of ~100 M float32 parameters with Adam (~1.2 GB), in one process.

Measured, each the median of ``--repeats`` runs:

- ``d2h``: the device-to-host copy a save must make: ``jax.device_get`` of the whole train state into
  host buffers allocated beforehand (on the CPU backend ``device_get`` returns views, so this is a
  memcpy there);
- ``blocked``: how long ``CheckpointStore.save_in_background`` keeps the training thread, after a first
  save has allocated the store's reusable host buffers (target: at most 1.2 x d2h);
- ``write``: from the call to the checkpoint being on disk (``wait()``), against writing the same bytes
  raw with NumPy (``ndarray.tofile`` + fsync) into the same folder (target: at least 0.7 x raw bandwidth);
- ``restore``: ``CheckpointStore.restore(target=...)``, verified (CRC-32) and rebuilt into the structure;
- ``training slowdown``: a trainer taking Adam steps on the same state, with the ``Checkpoint`` handler
  saving in the background every ``--every`` steps, against the same run without it (target: at most 5%).

Run: ``python benchmarks/checkpoint.py [--params N] [--repeats R] [--steps S] [--every E] [--dir PATH]``;
``--quick`` uses a small state (a smoke run, not a measurement).
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

from ember import Events
from ember.checkpoint import CheckpointStore
from ember.handlers import Checkpoint
from ember.training import TrainState, create_trainer

WIDTH = 4096  # parameters are (WIDTH, WIDTH) matrices: 16.8 M float32 each


def make_state(n_params: int) -> TrainState:
    rows = max(1, n_params // WIDTH)
    blocks = max(1, rows // WIDTH)
    params = {f"layer_{i}": jnp.full((rows // blocks, WIDTH), 0.01 * (i + 1), jnp.float32) for i in range(blocks)}
    return TrainState.create(lambda p, x: sum(jnp.sum(w[:1] * x) for w in p.values()), params, optax.adam(1e-3))


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


def measure_store(state: TrainState, root: Path, repeats: int) -> dict[str, list[float]]:
    tree = {"trainer": state}
    out: dict[str, list[float]] = {"d2h": [], "blocked": [], "write": [], "raw": [], "restore": []}
    buffers = [np.empty(x.shape, x.dtype) for x in jax.tree.leaves(tree)]
    store = CheckpointStore(root / "store")
    store.save_in_background(tree, step=0)  # allocates the store's host buffers, as a run's first save does
    store.delete(store.wait())  # type: ignore[arg-type]
    for r in range(1, repeats + 1):
        jax.block_until_ready(state)
        out["d2h"].append(timed(lambda: d2h_copy(tree, buffers)))
        start = time.perf_counter()
        store.save_in_background(tree, step=r)
        out["blocked"].append(time.perf_counter() - start)
        store.wait()
        out["write"].append(time.perf_counter() - start)
        raw_dir = root / f"raw_{r}"
        raw_dir.mkdir()
        out["raw"].append(timed(lambda d=raw_dir: raw_write(tree, d)))
        out["restore"].append(timed(lambda r=r: store.restore(target=tree, checkpoint=store.latest())))
        shutil.rmtree(raw_dir)
        store.delete(store.latest())  # type: ignore[arg-type]
    return out


def measure_training(
    state: TrainState, root: Path, steps: int, every: int, repeats: int
) -> tuple[list[float], list[float]]:
    """Per repeat: run time with background saves every ``every`` steps over run time without; step times.

    The run ends when the last save is on disk (COMPLETED waits for it), so the last save should come a
    few steps before the end, as it does in a real run: ``steps`` not a multiple of ``every``.
    """
    batch = jnp.ones((WIDTH,), jnp.float32)
    data = [batch] * steps
    ratios, step_times = [], []
    initial = jax.device_get(state)  # each trainer donates its state: every run starts from this host copy
    plain, saving = create_trainer(initial, loss_fn), create_trainer(initial, loss_fn)
    folder = root / "train"
    saver = Checkpoint({"trainer": saving}, folder, keep_latest=1)
    saver.attach(saving, Events.ITERATION_COMPLETED(every=every))
    for trainer in (plain, saving):  # compile outside the timing
        trainer.run(data[:1])
    for _ in range(repeats):
        times = []
        for trainer in (plain, saving):
            trainer.state.max_epochs = None
            trainer.state.train_state = trainer.placement.put_state(initial)
            jax.block_until_ready(trainer.state.train_state)
            start = time.perf_counter()
            trainer.run(data)  # COMPLETED waits for the last save to be on disk
            jax.block_until_ready(trainer.state.train_state)
            times.append(time.perf_counter() - start)
        ratios.append(times[1] / times[0])
        step_times.append(times[0] / steps)
        for info in saver.store.checkpoints():  # the next repeat saves the same steps again
            saver.store.delete(info)
    return ratios, step_times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=100_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder)")
    parser.add_argument("--quick", action="store_true", help="a small state: a smoke run, not a measurement")
    args = parser.parse_args()
    if args.quick:
        args.params, args.repeats, args.steps, args.every = 2_000_000, 1, 4, 2
    root = Path(tempfile.mkdtemp(dir=args.dir, prefix="ember-bench-"))
    try:
        state = make_state(args.params)
        n = sum(x.size for x in jax.tree.leaves(state.params))
        size = nbytes(state)
        dev = jax.devices()[0]
        print(f"python {platform.python_version()}, jax {jax.__version__} on {dev.platform} ({dev.device_kind})")
        print(f"train state: {n / 1e6:.1f} M float32 parameters with Adam, {size / 1e9:.2f} GB; folder {root}")
        store = measure_store(state, root, args.repeats)
        med = {k: statistics.median(v) for k, v in store.items()}
        gbps = {k: size / med[k] / 1e9 for k in ("write", "raw", "restore")}
        print(f"  d2h copy            {med['d2h']:8.3f} s")
        print(f"  blocked per save    {med['blocked']:8.3f} s  {med['blocked'] / med['d2h']:.2f} x d2h (target <= 1.2)")
        print(
            f"  write to disk       {med['write']:8.3f} s  {gbps['write']:.2f} GB/s, "
            f"{gbps['write'] / gbps['raw']:.2f} x raw ({gbps['raw']:.2f} GB/s; target >= 0.7)"
        )
        print(f"  restore (verified)  {med['restore']:8.3f} s  {gbps['restore']:.2f} GB/s")
        ratios, step_times = measure_training(state, root, args.steps, args.every, args.repeats)
        print(
            f"  training ({statistics.median(step_times):.3f} s/step), a background save every {args.every} of "
            f"{args.steps} steps: "
            f"{statistics.median(ratios):.3f} x the time without (median; range {min(ratios):.3f}-{max(ratios):.3f}; "
            "target <= 1.05)"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
