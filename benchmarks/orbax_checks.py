"""What OrbaxStore's file checks cost: a save that records every file's size and CRC-32, a restore that checks them.

Two sides, alternated round by round in one process, on the same tree of ``--mb`` megabytes of float32 (random, so
nothing compresses), into folders on the same disk:

- ``orbax``: orbax-checkpoint's own ``Checkpointer`` with the ``StandardCheckpointHandler`` (what ``OrbaxStore`` runs
  underneath): save, then restore into the same shapes;
- ``ember``: ``OrbaxStore.save`` (orbax's save, then every file read once for its CRC-32, the manifest, the atomic
  commit) and ``OrbaxStore.restore`` (every file read and checked, then orbax's restore).

The page cache is not dropped between rounds (that needs root), so a restore reads from memory as a relaunch on
the same machine does; the check's cost is then the checksum's, about 4 GB/s on one core. Each row: the median
seconds of each side, and ember's against orbax's.

Run: ``python benchmarks/orbax_checks.py [--mb MB] [--repeats R]``; results in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from _runs import interleaved

from ember.checkpoint import OrbaxStore


def make_tree(megabytes: int) -> dict[str, Any]:
    """``megabytes`` of float32 in 8 arrays, random (incompressible), on the default device."""
    per = megabytes * (1 << 20) // 4 // 8
    rng = np.random.default_rng(0)
    return {f"w{i}": jax.device_put(rng.standard_normal(per, dtype=np.float32)) for i in range(8)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512, help="the tree's size in megabytes")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tree = make_tree(args.mb)
    target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in tree.items()}
    root = Path(tempfile.mkdtemp(prefix="ember-orbax-checks-"))
    plain, store = ocp.Checkpointer(ocp.StandardCheckpointHandler()), OrbaxStore(root / "ember")
    rounds = iter(range(10**6))

    def orbax_save() -> float:
        folder = root / "orbax" / str(next(rounds))
        start = time.perf_counter()
        plain.save(folder, args=ocp.args.StandardSave(tree))
        return time.perf_counter() - start

    def ember_save() -> float:
        start = time.perf_counter()
        store.save(tree, step=next(rounds))
        return time.perf_counter() - start

    saves = interleaved({"orbax": orbax_save, "ember": ember_save}, args.repeats)
    latest = store.latest()
    orbax_folder = max((root / "orbax").iterdir(), key=lambda p: int(p.name))
    assert latest is not None

    def orbax_restore() -> float:
        start = time.perf_counter()
        jax.block_until_ready(plain.restore(orbax_folder, args=ocp.args.StandardRestore(target)))
        return time.perf_counter() - start

    def ember_restore() -> float:
        start = time.perf_counter()
        jax.block_until_ready(store.restore(target=target, checkpoint=latest)[0])
        return time.perf_counter() - start

    restores = interleaved({"orbax": orbax_restore, "ember": ember_restore}, args.repeats)
    store.close()
    shutil.rmtree(root, ignore_errors=True)
    dev = jax.devices()[0]
    print(
        f"jax {jax.__version__}, orbax-checkpoint {ocp.__version__} on {dev.platform}; {args.mb} MB, {args.repeats} "
        "repeats, medians"
    )
    for name, result in (("save", saves), ("restore", restores)):
        o, e = statistics.median(result["orbax"]), statistics.median(result["ember"])
        print(f"{name:8s} orbax {o:7.3f} s   ember {e:7.3f} s   ember / orbax {e / o:5.2f}   (+{e - o:.3f} s)")


if __name__ == "__main__":
    main()
