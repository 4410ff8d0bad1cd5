"""`ember launch -n N COMMAND`: N local processes with the coordinator set, output prefixed, signals forwarded."""

import io
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ember.cli._launch import GRACE, launch
from tests.subprocesses import alive

CHILD = """
import os, signal, sys, time
index = int(os.environ["EMBER_PROCESS_ID"])
mode = sys.argv[1]
def stop(sig, frame):  # no buffered print in a handler: it may interrupt one (its flush holds stdout's lock)
    os.write(1, f"got signal {sig}\\n".encode())
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
if mode == "env":
    env = os.environ
    print(env["EMBER_COORDINATOR"], env["EMBER_NUM_PROCESSES"], index, env["JAX_COORDINATOR_ADDRESS"])
    print(f"to stderr from {index}", file=sys.stderr)
elif mode == "fail":  # process 1 fails once process 0 is ready (its SIGTERM handler set)
    ready = sys.argv[2]
    if index == 1:
        deadline = time.monotonic() + 60
        while not os.path.exists(ready) and time.monotonic() < deadline:
            time.sleep(0.01)
        sys.exit(3)
    open(ready, "w").close()
    time.sleep(600)
elif mode.startswith("lose"):  # "lose1": process 1 is SIGKILLed once the other is ready (its SIGTERM handler set)
    ready = sys.argv[2]
    if index == int(mode[4:]):
        deadline = time.monotonic() + 60
        while not os.path.exists(ready) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    open(ready, "w").close()
    time.sleep(600)
elif mode in ("wait", "pid"):
    print(f"ready {os.getpid()}", flush=True)
    time.sleep(600)
elif mode == "plain":  # no handler of its own: SIGTERM ends it as the system does
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print(f"ready {os.getpid()}", flush=True)
    time.sleep(600)
elif mode == "deaf":  # process 0 ignores SIGTERM; process 1 fails once it is ready
    ready = sys.argv[2]
    if index == 1:
        deadline = time.monotonic() + 60
        while not os.path.exists(ready) and time.monotonic() < deadline:
            time.sleep(0.01)
        sys.exit(4)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(ready, "w").close()
    time.sleep(120)  # a launcher that never kills it returns after this, and the test fails on the time taken
"""


def run_launcher(mode: str, *args: str, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-m", "ember.cli", "launch", "-n", "2", "--", sys.executable, "-c", CHILD, mode, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def processes_under(pid: int) -> dict[int, list[str]]:
    """The children of ``pid``: each one's state, and its pending, blocked and caught signals (from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text().splitlines()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status if ":\t" in line)
        if fields.get("PPid") == str(pid):
            keep = ("State", "SigPnd", "ShdPnd", "SigBlk", "SigCgt")
            found[int(entry.name)] = [f"{key} {fields[key].strip()}" for key in keep]
    return found


def test_each_process_gets_the_coordinator_and_its_index_and_its_output_is_prefixed():
    """Both processes see one coordinator, 2 processes, their own index; their lines come back marked [i]."""
    done = run_launcher("env")
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0, err
    lines = sorted(out.splitlines())
    assert [line[:4] for line in lines] == ["[0] ", "[1] "]
    address = lines[0].split()[1]
    assert address.startswith("localhost:")
    assert lines == [f"[0] {address} 2 0 {address}", f"[1] {address} 2 1 {address}"]
    assert sorted(err.splitlines()) == ["[0] to stderr from 0", "[1] to stderr from 1"]


def test_the_first_failure_is_the_exit_status_and_the_others_are_stopped(tmp_path):
    """Process 1 exits 3: process 0 (sleeping) gets SIGTERM; the launcher exits 3 well within the grace."""
    started = time.monotonic()
    done = run_launcher("fail", str(tmp_path / "ready"))
    out, _ = done.communicate(timeout=GRACE + 60)
    assert done.returncode == 3
    assert out.splitlines() == [f"[0] got signal {int(signal.SIGTERM)}"]
    assert time.monotonic() - started < GRACE


@pytest.mark.parametrize("lost", [0, 1])
def test_a_lost_process_whichever_it_is_ends_the_run_with_the_requeue_status_naming_it(tmp_path, lost):
    """SIGKILL of the coordinator or of another process: exit 75 (what a requeue loop relaunches on), not 137."""
    done = run_launcher(f"lose{lost}", str(tmp_path / "ready"))
    out, err = done.communicate(timeout=GRACE + 60)
    assert done.returncode == 75, err
    assert (
        f"ember launch: process {lost} was lost (SIGKILL); the others were stopped. Exit 75: run the same command "
        "again to resume from the last checkpoint.\n"
    ) in err
    assert f"[{1 - lost}] got signal {int(signal.SIGTERM)}" in out.splitlines()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_are_forwarded_to_every_process(sig):
    """The launcher's signal reaches both processes once each; they end cleanly, and so does the launcher."""
    done = run_launcher("wait")
    try:
        ready = [done.stdout.readline() for _ in range(2)]  # type: ignore[union-attr]
        assert all(" ready " in line for line in ready), ready
        done.send_signal(sig)
        try:
            out, err = done.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # say which process did not end, and what it had pending
            raise AssertionError(f"the launcher still runs after 60 s: {processes_under(done.pid)}") from None
    finally:  # reaped whatever happens: a launcher left running would fail a later test with its ResourceWarning
        if done.poll() is None:
            done.kill()
            done.communicate(timeout=30)
    assert done.returncode == 0, err
    assert sorted(out.splitlines()) == [f"[0] got signal {int(sig)}", f"[1] got signal {int(sig)}"]


def test_sigterm_forwarded_to_processes_without_a_handler_ends_the_launch_143_and_none_was_lost():
    """Processes that SIGTERM ends as the system does: the launcher exits 128 + 15, as a shell; no "was lost" line."""
    done = run_launcher("plain")
    try:
        ready = [done.stdout.readline() for _ in range(2)]  # type: ignore[union-attr]
        assert all(" ready " in line for line in ready), ready
        done.send_signal(signal.SIGTERM)
        out, err = done.communicate(timeout=60)
    finally:
        if done.poll() is None:
            done.kill()
            done.communicate(timeout=30)
    assert done.returncode == 143, err
    assert "was lost" not in err
    assert out == ""


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_and_the_first_failure_is_the_status(
    tmp_path, monkeypatch
):
    """Process 1 exits 4; process 0 ignores the SIGTERM sent to stop it: SIGKILL after the grace, exit 4, none lost."""
    from ember.cli import _launch

    monkeypatch.setattr(_launch, "GRACE", 1.0)
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    status = launch(2, [sys.executable, "-c", CHILD, "deaf", str(tmp_path / "ready")], stdout=out, stderr=err)
    assert (status, out.getvalue()) == (4, "")
    assert "was lost" not in err.getvalue()
    assert 1.0 <= time.monotonic() - started < 60  # the grace, then the SIGKILL: not the 120 s the process sleeps


def test_a_killed_launcher_takes_its_processes_with_it():
    """SIGKILL of the launcher: both processes are gone within 10 s (none lives on, re-parented)."""
    done = run_launcher("pid")
    pids = [int(done.stdout.readline().split()[-1]) for _ in range(2)]  # type: ignore[union-attr]
    done.kill()
    done.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.1)
    assert [pid for pid in pids if alive(pid)] == []


def test_bad_arguments_are_named():
    """No processes, or no command: each refused with what to give."""
    with pytest.raises(ValueError, match=r"`count` \(-n\) must be a positive number of processes, got 0\."):
        launch(0, ["true"])
    with pytest.raises(ValueError, match=r"`command` is empty: name the program to run"):
        launch(2, [])
