"""A process lost in a 2-process run: the survivor ends at once with ember's message; relaunching resumes."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.distributed.launch import free_port

SCRIPT = Path(__file__).with_name("lost_process_script.py")
ROOT = SCRIPT.parents[2]


def _launch(workdir: Path, *extra: str) -> list[subprocess.Popen[str]]:
    port = free_port()
    return [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), str(pid), port, str(workdir), *extra],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in range(2)
    ]


def _finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    out = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=120)  # a hang fails here instead of blocking the suite
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.append((proc.returncode, stdout, stderr))
    return out


def _result(stdout: str) -> dict:
    return json.loads(next(x for x in stdout.splitlines() if x.startswith("RESULT "))[len("RESULT ") :])


@pytest.fixture(scope="module", params=["data_parallel", "fsdp"])
def straight(request, tmp_path_factory):
    """The uninterrupted run, data parallel or with its state sharded over the 4 devices (FSDP, orbax)."""
    extra = ("fsdp",) if request.param == "fsdp" else ()
    (rc0, out0, err0), (rc1, _, err1) = _finish(_launch(tmp_path_factory.mktemp("straight"), *extra))
    assert (rc0, rc1) == (0, 0), err0[-2000:] + err1[-2000:]
    return {"extra": extra, **_result(out0)}


def test_the_survivor_of_a_killed_process_names_it_and_the_checkpoint_then_a_relaunch_resumes(tmp_path, straight):
    """Process 1 killed at iteration 5, background saves: process 0 exits 75 naming the newest committed checkpoint."""
    extra = straight["extra"]
    started = time.monotonic()
    (rc0, _, err0), (rc1, _, _) = _finish(_launch(tmp_path, "kill", *extra))
    elapsed = time.monotonic() - started
    assert rc1 == -signal.SIGKILL
    assert rc0 == 75, err0[-3000:]
    assert elapsed < 60, f"the survivor took {elapsed:.0f} s to end"
    message = next(line for line in err0.splitlines() if line.startswith("ember: "))
    # found by a failed collective (Gloo closes the connection at once) or, if the survivor was elsewhere (an
    # orbax save), by the coordination service's heartbeat: either way process 1 is named
    assert message.startswith("ember: process 1 of this 2-process run was lost (")
    on_disk = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("step_"))
    assert on_disk[-1] in ("step_00000002", "step_00000004")  # step 4's save may have needed the killed process
    newest = int(on_disk[-1].removeprefix("step_"))
    assert message.endswith(
        f"Process 0 stops here with exit status 75: the last complete checkpoint is {tmp_path / 'ckpt' / on_disk[-1]} "
        f"(step {newest}); relaunching resumes from it. Relaunch every process."
    )
    results = _finish(_launch(tmp_path, *extra))
    assert [rc for rc, _, _ in results] == [0, 0], results[0][2][-2000:]
    resumed = _result(results[0][1])
    assert resumed["resumed_from"] == newest
    for a, b in zip(resumed["params"], straight["params"], strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
