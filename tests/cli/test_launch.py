"""`ember launch -n N COMMAND`: N local processes with the coordinator set, output prefixed, signals forwarded."""

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ember.cli import main
from ember.cli._launch import GRACE, launch
from tests.subprocesses import PYTHONPATH, alive

CHILD = """
import json, os, signal, sys, time
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
elif mode == "restart":  # process 1 ends 75 in the first launch, once process 0 is ready; a restart says which it is
    ready = sys.argv[2]
    if "EMBER_RESTART" in os.environ:
        given = json.loads(os.environ["EMBER_RESTART"])
        print(given["number"], given["of"], given["cause"], os.environ["EMBER_COORDINATOR"])
        sys.exit(0)
    if index == 1:
        deadline = time.monotonic() + 60
        while not os.path.exists(ready) and time.monotonic() < deadline:
            time.sleep(0.01)
        sys.exit(75)
    print("first", os.environ["EMBER_COORDINATOR"], flush=True)
    open(ready, "w").close()
    time.sleep(600)
elif mode == "requeue":  # process 1 ends 75 in every launch, once process 0 of that launch has said it launched
    restart = os.environ.get("EMBER_RESTART", "{}")
    print("launched", restart, flush=True)
    ready = f"{sys.argv[2]}.{json.loads(restart).get('number', 0)}"
    if index == 1:
        deadline = time.monotonic() + 60
        while not os.path.exists(ready) and time.monotonic() < deadline:
            time.sleep(0.01)
        sys.exit(75)
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


def run_launcher(mode: str, *args: str, launcher: tuple[str, ...] = (), **kwargs):
    """``ember launch -n 2 LAUNCHER -- python -c CHILD MODE ARGS``, its output piped."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ember.cli",
            "launch",
            "-n",
            "2",
            *launcher,
            "--",
            sys.executable,
            "-c",
            CHILD,
            mode,
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        **kwargs,
    )


def launcher_lines(err: str) -> list[str]:
    """The launcher's own lines in its standard error."""
    return [line for line in err.splitlines() if line.startswith("ember launch: ")]


def signalled(done: subprocess.Popen[str], sig: int) -> tuple[str, str]:
    """Send the launcher ``sig``; its output once it has ended (within 60 s, else the test fails naming what runs)."""
    try:
        done.send_signal(sig)
        try:
            return done.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # say which process did not end, and what it had pending
            raise AssertionError(f"the launcher still runs after 60 s: {processes_under(done.pid)}") from None
    finally:  # reaped whatever happens: a launcher left running would fail a later test with its ResourceWarning
        if done.poll() is None:
            done.kill()
            done.communicate(timeout=30)


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
    ready = [done.stdout.readline() for _ in range(2)]  # type: ignore[union-attr]
    out, err = signalled(done, sig)
    assert all(" ready " in line for line in ready), ready
    assert done.returncode == 0, err
    assert sorted(out.splitlines()) == [f"[0] got signal {int(sig)}", f"[1] got signal {int(sig)}"]


@pytest.mark.parametrize("launcher", [(), ("--max-restarts", "2")])
def test_sigterm_forwarded_to_processes_without_a_handler_ends_the_launch_143_and_none_was_lost(launcher):
    """Processes that SIGTERM ends as the system does: the launcher exits 128 + 15, as a shell; no "was lost" line.

    With restarts allowed too: 143 is resumable, but the launcher was told to stop: no restart, no process left.
    """
    done = run_launcher("plain", launcher=launcher)
    ready = [done.stdout.readline() for _ in range(2)]  # type: ignore[union-attr]
    out, err = signalled(done, signal.SIGTERM)
    assert all(" ready " in line for line in ready), ready
    assert done.returncode == 143, err
    assert "was lost" not in err
    assert (out, launcher_lines(err)) == ("", [])
    assert [pid for pid in (int(line.split()[-1]) for line in ready) if alive(pid)] == []


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


def test_a_run_that_ends_resumable_is_restarted_each_process_told_which_restart_it_is(tmp_path):
    """Process 1 exits 75: one line, every process launched again with a new coordinator, told restart 1 of 2."""
    done = run_launcher("restart", str(tmp_path / "ready"), launcher=("--max-restarts", "2"))
    out, err = done.communicate(timeout=GRACE + 60)
    assert done.returncode == 0, err
    assert launcher_lines(err) == ["ember launch: process 1 ended with status 75; restart 1 of 2."]
    lines = out.splitlines()
    first = next(line for line in lines if line.startswith("[0] first ")).split()[-1]
    address = lines[-1].split()[-1]
    assert address != first  # a fresh coordinator port: the old one may linger
    cause = "process 1 ended with status 75"
    assert sorted(lines) == sorted(
        [
            f"[0] first {first}",
            f"[0] got signal {int(signal.SIGTERM)}",
            f"[0] 1 2 {cause} {address}",
            f"[1] 1 2 {cause} {address}",
        ]
    )


def test_restarts_spent_end_the_launch_with_the_last_status_and_a_summary_after_the_backoff(tmp_path):
    """Process 1 exits 75 in every launch: 2 restarts 0.5 s apart, then the summary and exit 75; 3 launches."""
    started = time.monotonic()
    done = run_launcher("requeue", str(tmp_path / "ready"), launcher=("--max-restarts", "2", "--backoff", "0.5"))
    out, err = done.communicate(timeout=GRACE + 60)
    assert done.returncode == 75, err
    cause = "process 1 ended with status 75"
    assert launcher_lines(err) == [
        f"ember launch: {cause}; restart 1 of 2 in 0.5 s.",
        f"ember launch: {cause}; restart 2 of 2 in 0.5 s.",
        f"ember launch: 2 restarts spent; the launches ended: {cause}; {cause}; {cause}. Exit 75: run the same command "
        "again to resume from the last checkpoint.",
    ]
    launched = sorted(
        json.loads(line.split(" ", 2)[2]).get("number", 0) for line in out.splitlines() if "launched" in line
    )
    assert launched == [0, 0, 1, 1, 2, 2]
    assert time.monotonic() - started >= 1.0  # the two backoffs


def test_a_status_not_restarted_on_ends_the_launch_at_once(tmp_path):
    """Exit 3 with the default --restart-on (75,143): no restart. 75 with --restart-on 3: none either."""
    done = run_launcher("fail", str(tmp_path / "ready"), launcher=("--max-restarts", "2"))
    _, err = done.communicate(timeout=GRACE + 60)
    assert (done.returncode, launcher_lines(err)) == (3, [])
    done = run_launcher("requeue", str(tmp_path / "ready"), launcher=("--max-restarts", "2", "--restart-on", "3"))
    out, err = done.communicate(timeout=GRACE + 60)
    assert (done.returncode, launcher_lines(err)) == (75, [])
    assert len([line for line in out.splitlines() if "launched" in line]) == 2  # one launch


def test_restart_on_another_status_restarts_on_it(tmp_path):
    """--restart-on 3: a process that exits 3 is restarted, then the restart spent names it."""
    done = run_launcher("fail", str(tmp_path / "ready"), launcher=("--max-restarts", "1", "--restart-on", "3"))
    _, err = done.communicate(timeout=2 * GRACE + 60)
    assert done.returncode == 3, err
    assert launcher_lines(err) == [
        "ember launch: process 1 ended with status 3; restart 1 of 1.",
        "ember launch: 1 restart spent; the launches ended: process 1 ended with status 3; process 1 ended with "
        "status 3. Exit 3: run the same command again to resume from the last checkpoint.",
    ]


def test_a_lost_process_with_restarts_is_named_in_the_restart_line(tmp_path):
    """Process 1 SIGKILLed each launch, one restart: it is named lost in the restart line and in the summary."""
    done = run_launcher("lose1", str(tmp_path / "ready"), launcher=("--max-restarts", "1"))
    _, err = done.communicate(timeout=2 * GRACE + 60)
    assert done.returncode == 75, err
    lost = "process 1 was lost (SIGKILL)"
    assert launcher_lines(err) == [
        f"ember launch: {lost}; restart 1 of 1.",
        f"ember launch: 1 restart spent; the launches ended: {lost}; {lost}. Exit 75: run the same command again "
        "to resume from the last checkpoint.",
    ]


def test_sigterm_during_the_backoff_stops_before_the_restart(tmp_path):
    """A signal while the launcher waits to restart: no restart, exit 143 at once, not after the 60 s backoff."""
    done = run_launcher("requeue", str(tmp_path / "ready"), launcher=("--max-restarts", "2", "--backoff", "60"))
    line = done.stderr.readline()  # type: ignore[union-attr]
    started = time.monotonic()
    out, err = signalled(done, signal.SIGTERM)
    assert line == "ember launch: process 1 ended with status 75; restart 1 of 2 in 60 s.\n"
    assert done.returncode == 143, err
    assert time.monotonic() - started < 30
    assert launcher_lines(err) == ["ember launch: stopped before restart 1; run the same command again to resume."]
    assert len([line for line in out.splitlines() if "launched" in line]) == 2  # no second launch


def test_bad_restart_settings_are_named(capsys):
    """A negative count, a status that is not one, a negative backoff: each names the option and the value."""
    with pytest.raises(
        ValueError, match=r"`max_restarts` \(--max-restarts\) must be a number of restarts >= 0, got -1\."
    ):
        launch(2, ["true"], max_restarts=-1)
    with pytest.raises(
        ValueError, match=r"`restart_on` \(--restart-on\) must be exit statuses from 1 to 255, got \('75',\)"
    ):
        launch(2, ["true"], restart_on=("75",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`backoff` \(--backoff\) must be a number of seconds >= 0, got -1\.0\."):
        launch(2, ["true"], backoff=-1.0)
    with pytest.raises(SystemExit) as refused:
        main(["launch", "-n", "2", "--restart-on", "75,x", "--", "true"])
    assert refused.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "ember launch: error: argument --restart-on: expected exit statuses from 1 to 255 separated by commas, got "
        "'75,x'"
    )
    assert main(["launch", "-n", "2", "--max-restarts", "-1", "--", "true"]) == 2
    assert capsys.readouterr().err == (
        "ember: error: `max_restarts` (--max-restarts) must be a number of restarts >= 0, got -1.\n"
    )
