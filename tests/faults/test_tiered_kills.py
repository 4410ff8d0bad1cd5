"""SIGKILL at random points of a run saving into a TieredStore, then its fast tier wiped.

Every relaunch resumes from the newest fast step, bit for bit; with the fast tier wiped, from the newest durable one;
and the run ends as an uninterrupted one does.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.subprocesses import PYTHONPATH, ROOT

SCRIPT = Path(__file__).with_name("tiered_kill_script.py")
ITERATIONS = 160


def launch(folder: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(folder)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def lines(proc: subprocess.Popen[str]):
    for line in proc.stdout:  # type: ignore[union-attr]  # piped
        yield line.split()


def newest(tier: Path) -> int:
    """The newest committed checkpoint's step in a tier's folder (read only), 0 if none."""
    if not tier.is_dir():
        return 0
    found = [
        json.loads((p / "manifest.json").read_text())["step"]
        for p in tier.iterdir()
        if p.is_dir() and not p.name.startswith((".", "corrupt-")) and (p / "manifest.json").exists()
    ]
    return max(found, default=0)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, str]:
    """The digest after each iteration of an uninterrupted run, and at its end ("done")."""
    proc = launch(tmp_path_factory.mktemp("reference"))
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    digests = {words[1]: words[2] for words in (line.split() for line in out.splitlines()) if words[0] == "step"}
    digests["done"] = out.splitlines()[-1].split()[1]
    assert len(digests) == ITERATIONS + 1
    return digests


def relaunch_and_kill(folder: Path, rng: random.Random, reference: dict[str, str], expected: int) -> None:
    """Relaunch; check it resumed from step ``expected`` exactly; let it train 1-4 more steps, then SIGKILL it.

    Each relaunch trains fewer steps than ``durable_every``: the durable tier is reached because the count of saves
    goes on across relaunches.
    """
    proc = launch(folder)
    try:
        read = lines(proc)
        first = next(read)
        assert first[:2] == ["resumed", str(expected)], (first, proc.stderr.read())  # type: ignore[union-attr]
        if expected:
            assert first[2] == reference[str(expected)]
        for _ in range(rng.randint(1, 4)):
            words = next(read)
            assert words[0] == "step", words
            assert words[2] == reference[words[1]], words
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)


def kills_then_wipe(tmp_path: Path, reference: dict[str, str], kills: int, seed: int) -> None:
    rng = random.Random(seed)
    durable = tmp_path / "durable"

    def fast() -> Path:  # the durable tier's folder of the fast tier, once the first launch has named it
        named = durable / ".tier-id"
        return tmp_path / "fast" / f"durable-{named.read_text() if named.exists() else ''}" / "process-0-of-1"

    for _ in range(kills):
        relaunch_and_kill(tmp_path, rng, reference, expected=newest(fast()))
    assert newest(fast()) >= newest(durable) > 0
    shutil.rmtree(tmp_path / "fast")  # the node is replaced: the run goes on from the durable tier
    proc = launch(tmp_path)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    resumed = out.splitlines()[0].split()
    assert resumed == ["resumed", str(newest_before := int(resumed[1])), reference[str(newest_before)]]
    assert out.splitlines()[-1] == f"done {reference['done']}"  # the same run as one never interrupted
    assert newest(durable) == ITERATIONS  # the last save went into the durable tier at COMPLETED


def test_three_kills_and_a_wiped_fast_tier(tmp_path, reference):
    kills_then_wipe(tmp_path, reference, kills=3, seed=0)


@pytest.mark.slow
def test_twenty_kills_and_a_wiped_fast_tier(tmp_path, reference):
    kills_then_wipe(tmp_path, reference, kills=20, seed=1)
