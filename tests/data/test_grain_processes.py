"""Grain's worker processes never outlive the run, and a run leaves no shared memory behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.subprocesses import PYTHONPATH, alive

SCRIPT = Path(__file__).with_name("grain_workers_script.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mode", ["run", "loop", "keep"])
def test_a_run_that_ends_leaves_no_shared_memory_and_prints_nothing_of_it(mode):
    """An engine's run, a loop left open, a kept last batch: no resource_tracker warning, no error at exit."""
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), mode], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "done"
    assert "leaked" not in done.stderr, done.stderr[-3000:]
    assert "Exception ignored" not in done.stderr, done.stderr[-3000:]


def test_the_workers_end_when_the_main_process_is_killed():
    """SIGKILL of the main process mid-run: its output pipe closes and every child it had is gone within 30 s."""
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "kill"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("children "), line
        kids = [int(p) for p in line.split()[1:]]
        assert len(kids) >= 2, kids  # the two workers (and Grain's helpers)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)  # the end of its stdout: no child holds the pipe any more
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 30
    while any(alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [k for k in kids if alive(k)] == []
