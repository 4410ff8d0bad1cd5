"""`ember train --distributed` with the default config: 2 real processes on localhost, one killed, relaunched."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ember._ledger_file import read_records
from ember.cli import goodput_table
from ember.cli._verify_resume import Verdict, _compare_checkpoints, _compare_records
from tests.cli.test_launch import processes_under
from tests.distributed.launch import free_port
from tests.subprocesses import PYTHONPATH, devices, end_group, run_python

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["handlers.progress=false", "trainer.max_epochs=2"]
#: One simulated device per process; a process lost is declared so in 15 s, a busy machine misses no heartbeat.
ENV = {"XLA_FLAGS": devices(1), "JAX_PLATFORMS": "cpu", "EMBER_HEARTBEAT_TIMEOUT": "15"}

#: ``ember ARGS``, but process 1 of the first launch SIGKILLs itself after iteration 30 (ember verify-resume's kill):
#: a restart by ember launch (EMBER_RESTART set) runs whole.
_KILL_ONCE = """
import os, sys
if os.environ["EMBER_PROCESS_ID"] == "1" and "EMBER_RESTART" not in os.environ:
    os.environ["EMBER_KILL_AT_ITERATION"] = "30"
from ember.cli._main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The default config (2 epochs) trained by ``ember launch -n 2``, as a user runs it: its folder and its lines."""
    run = tmp_path_factory.mktemp("straight") / "two"
    train = [sys.executable, "-m", "ember.cli", "train", "--distributed", "--output", str(run), *ARGS]
    launched = run_python(
        ["-m", "ember.cli", "launch", "-n", "2", "--", *train], env={**ENV, "EMBER_HEARTBEAT_TIMEOUT": "30"}
    )
    assert launched.returncode == 0, launched.stderr[-3000:]
    return run, launched


def start(
    run: Path, *, args: list[str] = ARGS, processes: int = 2, command: list[str] | None = None
) -> list[subprocess.Popen[str]]:
    """``processes`` processes of ``ember train --distributed`` into ``run`` (or ``ember COMMAND``), output beside."""
    port = free_port()
    procs = []
    for pid in range(processes):
        env = {
            **os.environ,
            "EMBER_COORDINATOR": f"localhost:{port}",
            "EMBER_NUM_PROCESSES": str(processes),
            "EMBER_PROCESS_ID": str(pid),
            **ENV,
        }
        given = command or ["train", "--distributed", "--output", str(run), *args]
        with open(run.with_suffix(f".{pid}.out"), "w") as out, open(run.with_suffix(f".{pid}.err"), "w") as err:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "ember.cli", *given],
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=err,
                    text=True,
                    start_new_session=True,
                )
            )
    return procs


def finish(procs: list[subprocess.Popen[str]], timeout: float = 300) -> list[int]:
    """Every process's exit status; a process still running after ``timeout`` seconds is killed and fails the test."""
    deadline = time.monotonic() + timeout
    try:
        return [proc.wait(timeout=max(1.0, deadline - time.monotonic())) for proc in procs]
    finally:
        for proc in procs:  # each its own process group: what it started ends with it
            end_group(proc.pid)
            proc.wait(timeout=30)


def kill_the_second_once(procs: list[subprocess.Popen[str]], run: Path, ready: Callable[[], bool], what: str) -> str:
    """SIGKILL process 1 once ``ready()`` (polled, at most 240 s); process 0 must exit 75: its ``ember:`` line."""
    deadline = time.monotonic() + 240
    while not ready():
        assert time.monotonic() < deadline, f"{what} within 240 s"
        assert procs[0].poll() is None, output(run, 0, "err")[-3000:]
        time.sleep(0.2)
    os.kill(procs[1].pid, signal.SIGKILL)
    assert finish(procs, timeout=120) == [75, -signal.SIGKILL], output(run, 0, "err")[-3000:]
    message = next(line for line in output(run, 0, "err").splitlines() if line.startswith("ember: "))
    assert message.startswith("ember: process 1 of this 2-process run was lost (")
    return message


def output(run: Path, pid: int, kind: str = "out") -> str:
    return run.with_suffix(f".{pid}.{kind}").read_text()


def epoch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("epoch ")]


def test_two_processes_train_the_default_config_as_one_process_on_two_devices(tmp_path, straight):
    """The main job on 2 processes prints 1 process x 2 devices' epoch lines, from process 0 only; relaunch: done."""
    one = tmp_path / "one"
    two_devices = {"XLA_FLAGS": devices(2), "JAX_PLATFORMS": "cpu"}
    reference = run_python(["-m", "ember.cli", "train", "--output", str(one), *ARGS], env=two_devices)
    assert reference.returncode == 0, reference.stderr[-3000:]
    run, launched = straight
    lines = launched.stdout.splitlines()
    screen = lines + launched.stderr.splitlines()  # the run's own lines only: no blank ones, none of the runtime's
    assert [line for line in screen if line.strip() in ("[0]", "[1]")] == []
    assert [line for line in screen if "[Gloo]" in line or ".cc:" in line] == []
    assert [line[4:] for line in lines if line.startswith("[0] epoch ")] == epoch_lines(reference.stdout)
    assert len(epoch_lines(reference.stdout)) == 2
    assert [line for line in lines if line.startswith("[1] epoch ")] == []  # process 1 prints no epoch line
    said = [line for line in lines if "Training on" in line]
    assert said == ["[0] Training on cpu: 2 devices in 2 processes, placement DataParallel (auto), precision float32."]
    assert any(line.startswith("[0] Done: 2 epochs, 44 iterations") for line in lines)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_accuracy"] == json.loads((one / "summary.json").read_text())["best_accuracy"]
    assert finish(start(run)) == [0, 0]
    assert f"{run}: this run is already complete; nothing to do." in output(run, 0)


def test_a_killed_process_ends_the_other_with_status_75_and_the_relaunch_resumes(tmp_path, mlp_run):
    """Process 1 SIGKILLed after the first epoch: process 0 exits 75 naming the checkpoint; both relaunched resume.

    The run starts from another's weights (``init:``) on both processes; the relaunch resumes its own checkpoint
    and reads the source no more (deleted before it).
    """
    run, source = tmp_path / "run", tmp_path / "source"
    shutil.copytree(mlp_run, source)
    args = ["handlers.progress=false", "trainer.max_epochs=3", "model.name=mlp", f"init.source={source}"]
    procs = start(run, args=args)
    message = kill_the_second_once(procs, run, lambda: bool(epoch_lines(output(run, 0))), "no epoch finished")
    assert "Relaunch every process." in message
    assert f"Started from {source / 'checkpoints' / 'latest' / 'step_00000022'}: 4 loaded" in output(run, 0)
    shutil.rmtree(source)
    assert finish(start(run, args=args)) == [0, 0], output(run, 0, "err")[-3000:]
    assert "Resuming " in output(run, 0)
    assert "Started from" not in output(run, 0)
    assert "Done: 3 epochs, 66 iterations" in output(run, 0)


def test_ember_launch_restarts_a_run_whose_process_was_killed_and_it_ends_as_an_uninterrupted_run(tmp_path, straight):
    """Process 1 SIGKILLed after iteration 30, --max-restarts 2: one restart line; the run completes as it would have.

    Its checkpoint and records equal the straight run's bit for bit; the ledger counts the restart and the steps
    trained again; a relaunch of the finished run answers at once.
    """
    run = tmp_path / "run"
    train = [sys.executable, "-c", _KILL_ONCE, "train", "--distributed", "--output", str(run), *ARGS]
    launch = ["-m", "ember.cli", "launch", "-n", "2", "--max-restarts", "2", "--", *train]
    launched = run_python(launch, env=ENV, timeout=500)
    assert launched.returncode == 0, launched.stderr[-3000:]
    said = [line for line in launched.stderr.splitlines() if line.startswith("ember launch: ")]
    assert said == ["ember launch: process 1 was lost (SIGKILL); restart 1 of 2."]
    assert any(line.startswith("[0] Resuming ") for line in launched.stdout.splitlines())
    assert any(line.startswith("[0] Done: 2 epochs, 44 iterations") for line in launched.stdout.splitlines())
    verdict = Verdict()
    _compare_checkpoints(straight[0], run, verdict, rtol=0.0)
    _compare_records(straight[0], run, verdict, rtol=0.0)
    assert verdict.exact, verdict.lines
    killed, restarted = read_records(run)
    resumed = restarted["first_iteration"]
    assert (killed["first_iteration"], killed["last_iteration"] >= resumed, resumed in (22, 30)) == (0, True, True)
    assert restarted["lost_steps"] == killed["last_iteration"] - resumed
    assert (restarted["ended"], restarted["last_iteration"]) == ("completed", 44)
    restart = restarted["restart"]
    assert (restart["number"], restart["of"], restart["cause"]) == (1, 2, "process 1 was lost (SIGKILL)")
    assert restart["waited"] > 0
    table = goodput_table(run).splitlines()
    assert table[-1].startswith("restarts: 1 by ember launch, ")
    second = next(line for line in table if line.startswith("  2. iterations "))
    assert second.endswith(f"; restart 1 of 2 after process 1 was lost (SIGKILL), {restart['waited']:.1f} s later")
    again = run_python(launch, env=ENV, timeout=120)  # a finished run: every process answers, none starts JAX's service
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.splitlines()[0] == f"[0] {run}: this run is already complete; nothing to do."
    assert [line for line in again.stdout.splitlines() if line.startswith("[1] ")] == []
    assert [line for line in again.stderr.splitlines() if line.startswith("ember launch: ")] == []


def _stopped_once(run: Path, which: int, launcher: tuple[str, ...] = (), resume_after: float | None = None):
    """``ember launch -n 2 LAUNCHER -- ember train --distributed`` (2 epochs), process ``which`` SIGSTOPped once.

    Stopped once the first epoch's checkpoint is on disk (SIGCONT after ``resume_after`` seconds, if given); every
    wait bounded.

    Returns the launcher's status, its output and error, and the seconds from the stop to the launcher's end.
    """
    args = ["handlers.progress=false", "trainer.max_epochs=2"]
    train = [sys.executable, "-m", "ember.cli", "train", "--distributed", "--output", str(run), *args]
    command = [sys.executable, "-m", "ember.cli", "launch", "-n", "2", *launcher, "--", *train]
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, **ENV}
    out_file, err_file = run.with_suffix(".out"), run.with_suffix(".err")
    with open(out_file, "w") as out, open(err_file, "w") as err:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not list((run / "checkpoints" / "latest").glob("step_00000022")):
            assert proc.poll() is None, err_file.read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint of the first epoch within 240 s"
            time.sleep(0.1)
        target = next(
            pid
            for pid in processes_under(proc.pid)
            if f"EMBER_PROCESS_ID={which}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        )
        os.kill(target, signal.SIGSTOP)
        stopped = time.monotonic()
        if resume_after is not None:
            time.sleep(resume_after)
            os.kill(target, signal.SIGCONT)
        status = proc.wait(timeout=400)
        took = time.monotonic() - stopped
    finally:
        end_group(proc.pid)
        proc.wait(timeout=30)
    return status, out_file.read_text(), err_file.read_text(), took


def _ember_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line[4:].startswith("ember: ") or line.startswith("ember launch: ")]


def test_a_stalled_coordinator_is_named_by_the_survivor_within_half_the_heartbeat_timeout(tmp_path):
    """Process 0 (which hosts the coordination service) SIGSTOPped: process 1 names it in ember's words, exit 75.

    Before the runtime's heartbeat abort (client.h, naming no process); the launcher wakes process 0 to end it.
    """
    status, _, err, took = _stopped_once(tmp_path / "run", 0)
    assert status == 75, err[-3000:]
    assert _ember_lines(err)[0] == (
        "[1] ember: process 0 of this 2-process run was lost (the coordination service on process 0 did not answer "
        "within 7.5 s: process 0 stalled or was lost). Process 1 stops here with exit status 75: the last complete "
        f"checkpoint is {tmp_path / 'run'}/checkpoints/latest/step_00000022 (step 22); relaunching resumes from it. "
        "Relaunch every process."
    ), err[-3000:]
    assert "Terminating process because the JAX distributed service" not in err
    assert took < 15 + 30  # the heartbeat timeout, and room for a busy machine: not the launcher's 30 s grace on top


def test_a_stalled_process_is_named_and_with_a_restart_the_run_completes(tmp_path):
    """Process 1 SIGSTOPped: its heartbeats stop, process 0 names it and exits 75; the run completes restarted.

    The launcher wakes process 1 to end it, restarts both, and the run resumes from a committed checkpoint.
    """
    status, out, err, _ = _stopped_once(tmp_path / "run", 1, launcher=("--max-restarts", "1"))
    assert status == 0, err[-3000:]
    said = _ember_lines(err)
    assert said[0].startswith(
        "[0] ember: process 1 of this 2-process run was lost (it stopped answering the coordination service). "
        "Process 0 stops here with exit status 75: the last complete checkpoint is "
    ), said
    assert said[-1] == "ember launch: process 0 ended with status 75; restart 1 of 1.", said
    assert "Done: 2 epochs, 44 iterations" in out


def test_a_process_stopped_and_continued_within_the_heartbeat_timeout_lets_the_run_go_on(tmp_path):
    """SIGSTOP, then SIGCONT 4 s later (the heartbeat timeout is 15 s): nobody is named, the run completes."""
    status, out, err, _ = _stopped_once(tmp_path / "run", 1, resume_after=4.0)
    assert status == 0, err[-3000:]
    assert _ember_lines(err) == []
    assert "Done: 2 epochs, 44 iterations" in out


#: ``ember ARGS``, but process 1 sleeps 60 s before the run's end meets the others: alive (its heartbeats go on),
#: stuck.
_STUCK_AT_THE_END = """
import os, sys, time
if os.environ["EMBER_PROCESS_ID"] == "1":
    from ember.cli import _train
    concluded = _train._concluded
    _train._concluded = lambda *args, **kwargs: (time.sleep(120), concluded(*args, **kwargs))[1]
from ember.cli._main import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_process_stuck_where_the_processes_meet_is_named_after_ember_wait_timeout(tmp_path):
    """Process 1 alive but stuck before the run's end (EMBER_WAIT_TIMEOUT=20): process 0 names it and exits 75.

    20 s, not less: every exchange of the run waits that long (a checkpoint's commit, the stragglers' window), and a
    loaded machine can keep two processes apart for seconds where they meet.
    """
    run = tmp_path / "run"
    train = [sys.executable, "-c", _STUCK_AT_THE_END, "train", "--distributed", "--output", str(run)]
    started = time.monotonic()
    launched = run_python(
        ["-m", "ember.cli", "launch", "-n", "2", "--", *train, "handlers.progress=false", "trainer.max_epochs=1"],
        env={**ENV, "EMBER_WAIT_TIMEOUT": "20"},
        timeout=300,
    )
    assert launched.returncode == 75, launched.stderr[-3000:]
    assert _ember_lines(launched.stderr) == [
        "[0] ember: process 1 did not reach 'ember train: checkpoints written' within 20 s (EMBER_WAIT_TIMEOUT): "
        "stalled, stuck or lost. Process 0 stops here with exit status 75: relaunch every process; the run resumes "
        "from its last complete checkpoint."
    ]
    assert time.monotonic() - started < 120  # not the 120 s process 1 sleeps: the launcher ended it


#: ``ember ARGS``, but process 1's data arrives 50 ms late, batch after batch: a slow pipeline on one host.
_SLOW_DATA = """
import os, sys, time
if os.environ["EMBER_PROCESS_ID"] == "1":
    from ember.data import _array_dataset
    fetch = _array_dataset._Pass.__next__
    _array_dataset._Pass.__next__ = lambda self: (time.sleep(0.05), fetch(self))[1]
from ember.cli._main import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_process_with_slow_data_is_named_by_the_straggler_report_and_an_even_run_names_no_one(tmp_path, straight):
    """Process 1's batches 50 ms late, windows of 5, patience 2: process 0 names it once and writes it the slowest.

    The straight run (windows at the epochs' ends) names no one.
    """
    run = tmp_path / "run"
    args = ["handlers.progress=false", "trainer.max_epochs=1", "handlers.stragglers.every=5"]
    train = [sys.executable, "-c", _SLOW_DATA, "train", "--distributed", "--output", str(run), *args]
    launched = run_python(
        ["-m", "ember.cli", "launch", "-n", "2", "--", *train, "handlers.stragglers.patience=2"], env=ENV, timeout=300
    )
    assert launched.returncode == 0, launched.stderr[-3000:]
    lags = [line for line in launched.stdout.splitlines() if " lags: " in line]
    assert len(lags) == 1, launched.stdout[-3000:]
    # at 15, or at 10 when the step was compiled before (the suite's compilation cache): a tenth of a compilation in
    # the first window is more than the lag
    assert re.match(
        r"\[0\] ember: process 1 lags: for 2 windows of 5 iterations in a row \(to iteration (10|15)\) its time "
        r"outside the step was ",
        lags[0],
    ), lags
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    slowest = [(r["step"], r["stragglers/slowest"]) for r in records if "stragglers/slowest" in r]
    assert [step for step, _ in slowest] == [5, 10, 15, 20, 22]
    assert [who for step, who in slowest if step > 5] == [1, 1, 1, 1]  # the first window holds the compilation
    ledger = read_records(run)[-1]["stragglers"]
    assert (ledger["windows"], ledger["named"]) == (5, [1])
    # process 1's 50 ms a batch, over what both spend outside the step (the epoch's validation, a handler's sync)
    assert ledger["outside_step"]["1"] - ledger["outside_step"]["0"] > 0.03, ledger
    even, launched_even = straight
    assert [line for line in launched_even.stdout.splitlines() if " lags: " in line] == []
    written = [json.loads(line) for line in (even / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in written if "stragglers/slowest" in r] == [22, 44]
