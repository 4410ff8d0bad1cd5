"""Exact resume in a new process, and SIGTERM preemption, through subprocesses (see resume_script.py)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_phase(phase, workdir, *, sigterm=False):
    cmd = [sys.executable, "-m", "tests.handlers.resume_script", phase, str(workdir)]
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    if sigterm:
        for line in proc.stdout:  # the child says when it is inside the step we want to interrupt
            lines.append(line.strip())
            if line.strip() == "READY":
                proc.send_signal(signal.SIGTERM)
                break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return lines + out.split()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("resume")
    run_phase("first", workdir)
    sigterm = {during: run_phase(f"{during}-sigterm", workdir, sigterm=True) for during in ("train", "eval")}
    run_phase("resume", workdir)
    return workdir, sigterm


def load(workdir, name):
    with np.load(workdir / f"{name}.npz") as f:
        leaves = [f[str(i)] for i in range(len(f.files))]
    return leaves, json.loads((workdir / f"{name}.json").read_text())


def assert_same_params(workdir, straight_name, resumed_name):
    """The two runs' final train states are equal bit for bit, and so are their counters; return those."""
    straight, straight_info = load(workdir, straight_name)
    resumed, resumed_info = load(workdir, resumed_name)
    for a, b in zip(straight, resumed, strict=True):
        np.testing.assert_array_equal(a, b)
    assert resumed_info == straight_info
    return straight_info


@pytest.mark.parametrize("model", ["linen", "nnx"])
@pytest.mark.parametrize("k", [8, 10])
def test_stopping_and_resuming_in_a_new_process_is_bit_exact(runs, model, k):
    """Dropout, batch norm, a shuffled dataset and early stopping's counter all continue exactly."""
    workdir, _ = runs
    straight_info = assert_same_params(workdir, f"straight-{model}", f"resumed-{model}-{k}")
    assert straight_info == {"iteration": 16, "epoch": 4, "counter": 3}  # early stopping ended it at epoch 4


def test_sigterm_in_training_saves_at_the_next_iteration_and_resumes_exactly(runs):
    workdir, sigterm = runs
    assert sigterm["train"][-2:] == ["iteration=6", "saved=6"]
    assert assert_same_params(workdir, "straight-linen-no-es", "resumed-train-sigterm") == {"iteration": 12, "epoch": 3}


def test_sigterm_in_evaluation_stops_it_without_completing_then_saves_the_trainer(runs):
    """The signal arrives in epoch 2's evaluation: no COMPLETED for it, a checkpoint at iteration 8."""
    workdir, sigterm = runs
    assert sigterm["eval"].count("EVALUATED") == 1  # epoch 1's evaluation only
    assert sigterm["eval"][-2:] == ["iteration=8", "saved=8"]
    assert assert_same_params(workdir, "straight-linen-no-es", "resumed-eval-sigterm") == {"iteration": 12, "epoch": 3}
