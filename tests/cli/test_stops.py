"""How ``ember train`` ends when it does not run to its last epoch: Ctrl-C, SIGTERM, early stopping, a NaN loss."""

import json
import os
import re
import signal
import subprocess
import sys
import threading

from ember.cli import train
from tests.subprocesses import ROOT

LONG_RUN = [
    "handlers.progress=false",
    "trainer.max_epochs=200",
    "handlers.early_stopping=null",
    "handlers.writers=[jsonl]",
]


def signalled_run(run_dir, sig, wait_for):
    """``ember train`` on a long run; ``sig`` once a line starting with ``wait_for`` is printed. (status, out, err)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ember.cli", "train", "--output", str(run_dir), *LONG_RUN],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    timer = threading.Timer(240, proc.kill)  # a bound on the whole run: a hang fails the test, never blocks it
    timer.start()
    try:
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith(wait_for):
                proc.send_signal(sig)
                break
        out, err = proc.communicate(timeout=240)
    finally:
        timer.cancel()
    return proc.returncode, "".join(lines) + out, err


def test_ctrl_c_saves_says_how_to_resume_and_exits_130_then_sigterm_does_the_same_on_the_resumed_run(tmp_path):
    run_dir = tmp_path / "run"
    status, out, err = signalled_run(run_dir, signal.SIGINT, "epoch   1 ")
    assert status == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    stopped = re.search(
        r"^Stopped at iteration (\d+) \(Ctrl-C\), the checkpoint saved; run the same command to "
        r"resume\. Best val accuracy 0\.\d{4}\. Run folder: ",
        out,
        re.M,
    )
    assert stopped, out
    iteration = int(stopped.group(1))
    assert 22 <= iteration < 200 * 22
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["stopped"], summary["stopped_early"], summary["iterations"]) == ("SIGINT", False, iteration)
    latest = sorted(p.name for p in (run_dir / "checkpoints" / "latest").iterdir())
    assert latest[-1] == f"step_{iteration:08d}"

    status, out, err = signalled_run(run_dir, signal.SIGTERM, "epoch ")  # the resumed run's first epoch
    assert status == 143, err[-3000:]
    assert f"Resuming {run_dir} from step_{iteration:08d} (iteration {iteration})." in out
    again = re.search(r"^Stopped at iteration (\d+) \(SIGTERM\), the checkpoint saved; run the same command", out, re.M)
    assert again, out
    assert int(again.group(1)) > iteration
    assert json.loads((run_dir / "summary.json").read_text())["stopped"] == "SIGTERM"


def test_a_run_ended_by_early_stopping_is_complete_for_the_same_command(tmp_path, capsys):
    """The improvement asked for (0.5) never comes: stopped after patience 2, announced; a relaunch does nothing."""
    config = {
        "trainer": {"max_epochs": 10},
        "handlers": {"progress": False, "early_stopping": {"patience": 2, "threshold": 0.5}, "writers": ["jsonl"]},
        "output": str(tmp_path),
    }
    first = train(config)
    assert (first["epochs"], first["stopped"], first["stopped_early"]) == (3, "early stopping", True)
    out = capsys.readouterr().out
    assert "Early stopping: val accuracy did not improve for 2 evaluations; stopped at epoch 3.\n" in out
    record = (tmp_path / "summary.json").read_text()
    again = train(config)
    out = capsys.readouterr().out
    assert f"{tmp_path}: this run is already complete; nothing to do." in out
    assert again == first
    assert (tmp_path / "summary.json").read_text() == record
