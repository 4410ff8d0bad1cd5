"""A stall in one process of two: both processes end with exit status 75, each with its stacks on disk."""

import re
import subprocess
import sys
import time
from pathlib import Path

from tests.distributed.launch import free_port

SCRIPT = Path(__file__).with_name("stall_script.py")
ROOT = SCRIPT.parents[2]


def test_a_handler_that_hangs_in_one_process_of_two_ends_both_with_a_diagnosis(tmp_path):
    port, started = free_port(), time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), str(pid), port, str(tmp_path)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in range(2)
    ]
    results = []
    for proc in procs:
        try:
            results.append(proc.communicate(timeout=100))  # the sleeper alone would take 120 s
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [p.returncode for p in procs] == [75, 75], [err[-2000:] for _, err in results]
    assert time.monotonic() - started < 100
    for pid, (stdout, _) in enumerate(results):
        assert "the run was not stopped" not in stdout
        report = (tmp_path / "run" / f"stall-process{pid}.txt").read_text()
        assert re.match(
            rf"ember: StallWatchdog: no iteration \(step_timeout={6 if pid == 0 else 3}\) completed in "
            rf"time\. Process {pid} of 2 \(pid \d+\) stops here with exit status 75",
            report,
        ), report[:500]
    sleeper = (tmp_path / "run" / "stall-process0.txt").read_text()
    assert re.search(r"running sleepy \(.*stall_script\.py:\d+\)", sleeper)
    assert re.search(r'File ".*stall_script\.py", line \d+ in sleepy', sleeper)
    waiter = (tmp_path / "run" / "stall-process1.txt").read_text()
    assert "running no handler: the process function (the step) or the data" in waiter
