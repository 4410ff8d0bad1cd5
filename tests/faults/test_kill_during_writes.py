"""SIGKILL at random moments while checkpoints are being written: a valid checkpoint is always found."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ember.checkpoint import CheckpointStore, OrbaxStore

SCRIPT = Path(__file__).with_name("kill_script.py")
ROOT = SCRIPT.parents[2]


def committed(folder: Path) -> bool:
    """Whether a checkpoint has been renamed into place (read only: opening a store would tidy the folder)."""
    return any(p.is_dir() and not p.name.startswith(".") and (p / "manifest.json").exists() for p in folder.iterdir())


def kill_and_check(folder: Path, rng: random.Random, kind: str) -> int:
    """Start the saver, kill it after a random delay, and check what it left; return the step restored."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(folder), kind],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = proc.stdout.readline()  # type: ignore[union-attr]
    assert first.startswith("started "), proc.stderr.read()  # type: ignore[union-attr]
    deadline = time.monotonic() + 120
    while not committed(folder):  # the first run: kill only once there is something to keep, however slow
        assert time.monotonic() < deadline, "no checkpoint was committed within 120 s"
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.4))
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    store = (OrbaxStore if kind == "orbax" else CheckpointStore)(folder)  # opening it removes interrupted writes
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]
    tree, info = store.restore()  # verified against the checksums; a corrupt latest would warn and fall back
    version = info.manifest["metadata"]["version"]  # the arrays and the manifest belong together
    assert info.step >= 1
    assert int(tree["step"]) == info.step
    np.testing.assert_array_equal(tree["w"], np.full((3, 1 << 20), info.step + 0.5 * version, np.float64))
    np.testing.assert_array_equal(tree["b"], np.full(7, info.step, np.int32))
    assert [c.path.name for c in store.checkpoints() if c.step == info.step][-1] == info.path.name
    getattr(store, "close", lambda: None)()
    return info.step


def trials(tmp_path: Path, n: int, seed: int, kind: str) -> list[int]:
    rng = random.Random(seed)
    steps = []
    for _ in range(n):  # the same folder each time: every run resumes after what the last one left
        steps.append(kill_and_check(tmp_path, rng, kind))
    return steps


@pytest.mark.parametrize("kind", ["msgpack", "orbax"])
def test_a_few_kills_always_leave_a_valid_checkpoint(tmp_path, kind):
    """Saves, amends and replacing saves, killed 3 times: the newest checkpoint restores whole, manifest and arrays."""
    steps = trials(tmp_path, 3, seed=0, kind=kind)
    assert steps == sorted(steps)  # each run continued from the previous run's latest checkpoint


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["msgpack", "orbax"])
def test_twenty_kills_always_leave_a_valid_checkpoint(tmp_path, kind):
    """The same, 20 kills in a row."""
    steps = trials(tmp_path, 20, seed=1, kind=kind)
    assert steps == sorted(steps)
