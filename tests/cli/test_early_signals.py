"""Ctrl-C (a real one, through a pseudo-terminal) and SIGTERM in the first seconds of ``ember train``.

Wherever the signal lands (JAX importing, the data loading, the model building or compiling, the first steps) the
launch ends with one line and the resumable status, and the same command then trains the run to its end. The test
waits until the command has taken the signals over (its SIGTERM handler shows in ``/proc``), then signals it after
each delay: a busier machine shifts the moment, never the outcome. The run's data holds it at its tenth step until
the signal is sent (`gated_data.py`), so a fast machine never finishes the run first.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.subprocesses import PYTHONPATH, end_group

ARGS = ["model.name=mlp", "trainer.max_epochs=1", "handlers.writers=[jsonl]", "data.name=grain"]
ARGS += ["data.path=tests.cli.gated_data:make"]  # the first pass waits at its tenth batch until the gate opens

#: How ``ember train`` says it stopped: before training (noted, honoured at a safe point), or in it (Preemption's).
STOPPED = re.compile(
    r"ember: stopped \((Ctrl-C|SIGTERM)\) before training started; run the same command to resume\."
    r"|Stopped at iteration \d+ \((Ctrl-C|SIGTERM)\), the checkpoint saved; run the same command to resume\."
)

#: Runs ``ember`` as the session leader of the pseudo-terminal ``argv[1]``: Ctrl-C typed there reaches it.
_IN_TERMINAL = "import os, sys; os.login_tty(os.open(sys.argv[1], os.O_RDWR)); os.execvp(sys.argv[2], sys.argv[2:])"


def catches_sigterm(pid):
    """Whether process ``pid`` has a handler for SIGTERM (``SigCgt`` in ``/proc``): ember's command line took it."""
    with open(f"/proc/{pid}/status") as f:
        caught = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


def stopped_early(run, delay, how):
    """``ember train`` in a terminal of its own, stopped by ``how`` ``delay`` s after it took the signals.

    Returns its status and everything it wrote there (bar included).
    """
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", _IN_TERMINAL, os.ttyname(slave), sys.executable, "-m", "ember.cli", "train", *ARGS,
         f"--output={run}"],
        env={**os.environ, "PYTHONPATH": PYTHONPATH, "EMBER_TEST_GATE": str(run.parent / "gate")},
    )  # fmt: skip
    written = []  # the slave stays open here until the process ends: a read of the master fails while none has it

    def read():
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal closed with the process
                return
            if not chunk:
                return
            written.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not catches_sigterm(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline  # noqa: PT018
            time.sleep(0.01)
        time.sleep(delay)
        if how == "Ctrl-C":
            os.write(master, b"\x03")  # typed: the terminal sends SIGINT to its foreground process group
        else:
            proc.send_signal(signal.SIGTERM)
        (run.parent / "gate").touch()  # the run goes on to its next step, where it stops
        status = proc.wait(timeout=240)
    finally:
        end_group(proc.pid)
        os.close(slave)
        reader.join(timeout=30)
        os.close(master)
    return status, b"".join(written).decode(errors="replace")


@pytest.mark.parametrize(("delay", "how"), [(0.0, "Ctrl-C"), (0.6, "Ctrl-C"), (2.0, "Ctrl-C"), (0.3, "SIGTERM")])
def test_a_stop_in_the_first_seconds_ends_with_one_line_and_the_resumable_status(tmp_path, delay, how):
    run = tmp_path / "run"
    status, written = stopped_early(run, delay, how)
    assert status == (130 if how == "Ctrl-C" else 143), written[-3000:]
    assert "Traceback" not in written
    assert "Exception ignored" not in written
    said = STOPPED.findall(written)
    assert len(said) == 1, written[-3000:]
    assert how in said[0]
    if delay == 2.0:  # the same command trains the run to its end
        done = subprocess.run(
            [sys.executable, "-m", "ember.cli", "train", *ARGS, "handlers.progress=false", f"--output={run}"],
            env={**os.environ, "PYTHONPATH": PYTHONPATH, "EMBER_TEST_GATE": str(tmp_path / "gate")},
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Done: 1 epochs, 21 iterations" in done.stdout


def test_a_signal_after_the_last_safe_point_is_preemptions_it_stops_before_the_first_batch(
    tmp_path, monkeypatch, capsys
):
    """SIGTERM noted between the last safe point and the run's start: handed to Preemption, which saves step 0."""
    from ember.cli import _train, main

    run_from_here = _train._run

    def signalled_then_run(*args, **kwargs):  # as a SIGTERM landing just after the checkpoint was read
        os.kill(os.getpid(), signal.SIGTERM)
        return run_from_here(*args, **kwargs)

    monkeypatch.setattr(_train, "_run", signalled_then_run)
    run = tmp_path / "run"
    args = ["train", "model.name=mlp", "trainer.max_epochs=1", "handlers.writers=[jsonl]", "handlers.progress=false"]
    assert main([*args, f"--output={run}"]) == 143
    assert capsys.readouterr().out.splitlines()[-1] == (
        "Stopped at iteration 0 (SIGTERM), the checkpoint saved; run the same command to resume. Best val accuracy "
        f"none yet (no evaluation finished). Run folder: {run}"
    )
    assert sorted(p.name for p in (run / "checkpoints" / "latest").iterdir()) == ["step_00000000"]
    monkeypatch.setattr(_train, "_run", run_from_here)
    assert main([*args, f"--output={run}"]) == 0
    assert "Done: 1 epochs, 22 iterations" in capsys.readouterr().out
