"""One writer per run folder: a second ``ember train`` (or watcher of one name) is refused; a dead one never blocks.

The training runs read `gated_data.py`: their first pass waits at its tenth batch until a gate file appears, so a
launch is held mid-run, on any machine however busy, while the test starts another; every wait is bounded.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from ember.cli import load_config, train
from tests.subprocesses import PYTHONPATH, end_group

ARGS = ["model.name=mlp", "data.name=grain", "data.path=tests.cli.gated_data:make", "trainer.max_epochs=1"]
ARGS += ["handlers.progress=false", "handlers.writers=[jsonl]"]


def start(command, gate, *, launcher=()):
    """``ember COMMAND`` in a fresh process (in a process group of its own) whose data waits for ``gate``."""
    return subprocess.Popen(
        [*launcher, sys.executable, "-m", "ember.cli", *command],
        env={**os.environ, "PYTHONPATH": PYTHONPATH, "EMBER_TEST_GATE": str(gate)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(proc, timeout=240):
    """``(status, out, err)`` of ``proc``, bounded; whatever it started is ended with it."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        end_group(proc.pid)
    return proc.returncode, out, err


def wait_for(path, proc, timeout=120):
    """Until ``path`` exists (``proc`` still running), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.05)


def records(run):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in r.items() if k != "time"} for r in map(json.loads, lines)]


def refusal(run, pid, what="run"):
    host = socket.gethostname()
    return (
        f"ember: {run} is held by another launch of this {what}: process {pid} on host {host}, since "
        f"{json.loads((run / 'held-by.json').read_text())['since']} (held-by.json). Wait for it to end, or stop it "
        f"(kill {pid} on {host}), then run this command again: it resumes.\n"
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The record of the run trained once, without a second launch."""
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    train(load_config(None, [*ARGS, f"output={run}"]), stream=io.StringIO())
    return records(run)


def first_to_end(procs, timeout=240):
    """The process of ``procs`` that ends first (bounded), and the others."""
    deadline = time.monotonic() + timeout
    while all(p.poll() is None for p in procs):
        assert time.monotonic() < deadline, "neither launch ended"
        time.sleep(0.05)
    ended = next(p for p in procs if p.poll() is not None)
    return ended, [p for p in procs if p is not ended]


@pytest.mark.parametrize("apart", ["at the same moment", "seconds apart"])
def test_a_second_launch_is_refused_in_one_line_and_the_record_is_an_uninterrupted_runs(tmp_path, apart, uninterrupted):
    run, gate = tmp_path / "run", tmp_path / "gate"
    command = ["train", *ARGS, f"--output={run}"]
    first = start(command, gate)
    second = None
    try:
        if apart == "seconds apart":
            wait_for(run / "config.yaml", first)  # the first is training (its data waits at the gate)
        second = start(command, gate)
        refused, (holder,) = first_to_end([first, second])  # at the same moment, either may win
        assert refused is second or apart == "at the same moment"
        status, _, err = finish(refused)
        assert (status, err) == (75, refusal(run, holder.pid)), err[-3000:]
        gate.touch()
        status, _, err = finish(holder)
        assert status == 0, err[-3000:]
    finally:
        for proc in (first, second):
            if proc is not None:
                end_group(proc.pid)
    assert records(run) == uninterrupted
    assert not (run / "held-by.json").exists()  # given back at the end


def test_a_sigkilled_holder_never_blocks_the_relaunch(tmp_path, uninterrupted):
    run, gate = tmp_path / "run", tmp_path / "gate"
    command = ["train", *ARGS, f"--output={run}"]
    first = start(command, gate)
    wait_for(run / "held-by.json", first)
    first.kill()
    finish(first)
    gate.touch()
    started = time.monotonic()
    status, _out, err = finish(start(command, gate))
    assert status == 0, err[-3000:]
    assert "held" not in err
    assert time.monotonic() - started < 200
    assert records(run) == uninterrupted


def test_a_two_process_run_is_held_as_one_and_its_sigkilled_process_0_never_blocks_the_relaunch(tmp_path):
    run, gate = tmp_path / "run", tmp_path / "gate"
    command = ["train", "--distributed", *ARGS, f"--output={run}"]
    launcher = [sys.executable, "-m", "ember.cli", "launch", "-n", "2", "--"]
    first = start(command, gate, launcher=launcher)
    try:
        wait_for(run / "config.yaml", first)
        holder = json.loads((run / "held-by.json").read_text())["pid"]  # process 0's
        status, _, err = finish(start(["train", *ARGS, f"--output={run}"], gate))
        assert (status, err) == (75, refusal(run, holder))
        os.kill(holder, signal.SIGKILL)
        status, _, err = finish(first)
        assert status == 75, err[-3000:]
        gate.touch()
        status, _out, err = finish(start(command, gate, launcher=launcher))
        assert status == 0, err[-3000:]
        assert "held" not in err
    finally:
        end_group(first.pid)
    assert not (run / "held-by.json").exists()


def test_a_second_watcher_of_one_name_is_refused_and_one_of_another_name_runs_beside(tmp_path):
    run = tmp_path / "run"
    cfg = {"model": {"name": "mlp"}, "trainer": {"max_epochs": 1}, "handlers": {"progress": False}}
    train({**cfg, "handlers": {**cfg["handlers"], "writers": ["jsonl"]}, "output": str(run)}, stream=io.StringIO())
    (run / "summary.json").unlink()  # the run has not ended, as far as a watcher can tell: it watches on
    watch = ["eval", str(run), "--watch", "--poll", "0.2"]
    first = start([*watch, "--name", "w"], tmp_path / "unused")
    beside = None
    try:
        wait_for(run / "eval" / "w" / "watch.json", first)  # it has evaluated a checkpoint
        holder = json.loads((run / "eval" / "w" / "held-by.json").read_text())["pid"]
        status, _, err = finish(start([*watch, "--name", "w"], tmp_path / "unused"))
        assert (status, err) == (75, refusal(run / "eval" / "w", holder, "watcher 'w'"))
        beside = start([*watch, "--name", "other"], tmp_path / "unused")
        wait_for(run / "eval" / "other" / "watch.json", beside)
        assert json.loads((run / "eval" / "other" / "held-by.json").read_text())["pid"] == beside.pid
        first.kill()  # a watcher SIGKILLed: its relaunch takes its place at once
        finish(first)
        again = start([*watch, "--name", "w"], tmp_path / "unused")
        wait_for(run / "eval" / "w" / "held-by.json", again)
        deadline = time.monotonic() + 120
        while json.loads((run / "eval" / "w" / "held-by.json").read_text())["pid"] != again.pid:
            assert again.poll() is None
            assert time.monotonic() < deadline
            time.sleep(0.05)
        again.kill()
        finish(again)
    finally:
        for proc in (first, beside):
            if proc is not None:
                end_group(proc.pid)
                proc.communicate(timeout=30)
