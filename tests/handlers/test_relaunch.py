"""The relaunch guarantee as a matrix: a job relaunched until it completes ends as an uninterrupted run would.

Each cell interrupts ``relaunch_job.job`` at one point (by an exception in this process, or by SIGKILL or
SIGTERM in a child process), optionally damages the newest checkpoint, then relaunches the same job until
it has completed. Every cell must complete after at most one extra launch, with final parameters and
every epoch's metric values equal to an uninterrupted run's (bit for bit, on CPU), delete nothing valid,
and a relaunch after completion must train nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from ember import Events
from tests.handlers.relaunch_job import POINTS, Interrupted, job

ROOT = Path(__file__).resolve().parents[2]
DAMAGES = ("truncated", "bit-flipped", "manifest-corrupted")


def damage(folder: Path, how: str) -> str:
    """Damage the newest checkpoint in ``folder/checkpoints`` as ``how`` says; return its name."""
    newest = max(
        (folder / "checkpoints").iterdir(), key=lambda p: json.loads((p / "manifest.json").read_text())["step"]
    )
    if how == "truncated":
        data = newest / "state.msgpack"
        data.write_bytes(data.read_bytes()[:-7])
    elif how == "bit-flipped":
        data = newest / "state.msgpack"
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        data.write_bytes(bytes(raw))
    else:
        manifest = newest / "manifest.json"
        text = manifest.read_text()
        manifest.write_text(text.replace('"float32"', '"floa432"', 1))
    return newest.name


def launch_in_process(folder: Path, save: str, point: str | None) -> bool:
    """One launch; whether it ended by the injected exception."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # fallbacks and "already complete" are asserted elsewhere
            job(folder, save, point)
    except Interrupted:
        return True
    return False


def launch_child(folder: Path, save: str, point: str | None, kill: int | None) -> None:
    """One launch in a child process; with ``kill``, the signal is sent when the child reaches ``point``."""
    cmd = [sys.executable, "-m", "tests.handlers.relaunch_job", str(folder), save, *([point] if point else [])]
    env = {**os.environ, "PYTHONWARNINGS": "ignore::UserWarning"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if kill is not None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.strip() == "READY":
                    proc.send_signal(kill)
                    break
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if kill == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL, err[-3000:]
    else:
        assert proc.returncode == 0, err[-3000:]


def relaunch_until_done(folder: Path, first_launch, relaunch) -> int:
    """Launch once (interrupted), then relaunch until ``final.json`` exists; return the number of launches."""
    first_launch()
    launches = 1
    while not (folder / "final.json").exists():
        assert launches < 3, f"the job did not complete after {launches} launches"
        relaunch()
        launches += 1
    return launches


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run."""
    folder = tmp_path_factory.mktemp("straight")
    job(folder, "epoch")
    return folder


def assert_same_run(folder: Path, straight: Path) -> None:
    with np.load(straight / "final.npz") as a, np.load(folder / "final.npz") as b:
        assert a.files == b.files
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key])
    assert json.loads((folder / "history.json").read_text()) == json.loads((straight / "history.json").read_text())
    assert json.loads((folder / "final.json").read_text()) == json.loads((straight / "final.json").read_text())


def assert_finished_run_stays_finished(folder: Path, save: str) -> None:
    """A relaunch after completion fires no iteration and warns that the run is complete."""
    before = sorted(p.name for p in (folder / "checkpoints").iterdir())
    fired: list[str] = []

    def count_events(trainer):
        for event in (Events.STARTED, Events.ITERATION_COMPLETED, Events.EPOCH_COMPLETED, Events.COMPLETED):
            trainer.add_event_handler(event, lambda e, event=event: fired.append(event.name))

    with pytest.warns(UserWarning, match=r"^The run loaded by load_state_dict\(\) is already complete \(epoch 3 of 3"):
        trainer = job(folder, save, setup=count_events)
    assert trainer.state.iteration == 12
    assert fired == []
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == before


#: The cells that passed in this run, printed in pytest's terminal summary (tests/conftest.py).
MATRIX: list[tuple[str, str, str, int]] = []

CELLS = [(save, point) for save in ("epoch", "iteration") for point in POINTS]


@pytest.mark.parametrize(("save", "point"), CELLS)
def test_a_job_interrupted_by_an_exception_completes_as_an_uninterrupted_one(tmp_path, straight, save, point):
    """Raised at each point, with checkpoints at epoch and at iteration events: same parameters and metrics."""
    launches = relaunch_until_done(
        tmp_path,
        lambda: launch_in_process(tmp_path, save, point),
        lambda: launch_in_process(tmp_path, save, None),
    )
    assert launches == 2
    assert_same_run(tmp_path, straight)
    assert_finished_run_stays_finished(tmp_path, save)
    MATRIX.append((save, point, "exception", launches))


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("save", ["epoch", "iteration"])
def test_a_damaged_newest_checkpoint_is_moved_aside_and_the_job_still_completes(tmp_path, straight, save, how):
    """Truncated, bit-flipped or manifest-corrupted: resume falls back, keeps the bad folder, ends the same."""
    assert launch_in_process(tmp_path, save, "during evaluation")
    bad = damage(tmp_path, how)
    with pytest.warns(UserWarning, match=rf"Checkpoint '.*{bad}' is corrupt: its .* moved aside to 'corrupt-{bad}'"):
        job(tmp_path, save)
    assert (tmp_path / "checkpoints" / f"corrupt-{bad}").is_dir()  # kept for a person to look at
    assert_same_run(tmp_path, straight)
    MATRIX.append((save, f"during evaluation, newest checkpoint {how}", "exception", 2))


def test_a_relaunch_of_a_finished_run_with_more_epochs_continues(tmp_path, straight):
    """Asking for more epochs than the finished run had trains exactly those epochs."""
    job(tmp_path, "epoch")
    import tests.handlers.relaunch_job as relaunch_job

    relaunch_job.EPOCHS = 4
    try:
        trainer = job(tmp_path, "epoch")
    finally:
        relaunch_job.EPOCHS = 3
    assert (trainer.state.epoch, trainer.state.iteration) == (4, 16)
    assert sorted(json.loads((tmp_path / "history.json").read_text())) == ["1", "2", "3", "4"]


SIGNAL_CELLS = [
    (save, point, kill)
    for save in ("epoch", "iteration")
    for point in POINTS
    for kill in (signal.SIGKILL, signal.SIGTERM)
]
QUICK = {("iteration", "mid-epoch", signal.SIGKILL), ("epoch", "during the last evaluation", signal.SIGTERM)}


@pytest.mark.parametrize(
    ("save", "point", "kill"),
    [
        pytest.param(*cell, marks=() if cell in QUICK else pytest.mark.slow, id=f"{cell[0]}-{cell[1]}-{cell[2].name}")
        for cell in SIGNAL_CELLS
    ],
)
def test_a_job_killed_by_a_signal_completes_as_an_uninterrupted_one(tmp_path, straight, save, point, kill):
    """SIGKILL (no warning) or SIGTERM (Preemption saves) at each point: the relaunched job ends the same."""
    launches = relaunch_until_done(
        tmp_path,
        lambda: launch_child(tmp_path, save, point, kill),
        lambda: launch_child(tmp_path, save, None, None),
    )
    assert launches == 2
    assert_same_run(tmp_path, straight)
    MATRIX.append((save, point, kill.name, launches))


def test_a_relaunched_best_k_checkpoint_knows_the_checkpoints_on_disk_before_its_first_save(tmp_path):
    """``last_checkpoint`` and the kept list of a relaunched handler name what the earlier launch kept."""
    from ember import Engine, Events
    from ember.handlers import Checkpoint

    scores = iter([0.5, 0.9, 0.7])
    engine = Engine(lambda e, b: b)
    best = Checkpoint({"trainer": engine}, tmp_path, n_saved=2, score_function=lambda e: next(scores), score_name="acc")
    best.attach(engine, Events.EPOCH_COMPLETED)
    engine.run([1, 2], max_epochs=3)
    best.store.close()
    again = Checkpoint({"trainer": Engine(lambda e, b: b)}, tmp_path, n_saved=2, score_name="acc")
    assert again.last_checkpoint.name == "step_00000004-acc=0.9000"
    assert again.state_dict() == {
        "_saved": [(0.7, "step_00000006-acc=0.7000"), (0.9, "step_00000004-acc=0.9000")],
    }
