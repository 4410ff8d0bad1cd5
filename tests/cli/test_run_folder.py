"""A run is one thing wherever it is started from: its folder, its id, its own fast checkpoint tier."""

import io
import json
import re
import signal

import pytest

from ember.checkpoint import TieredStore
from ember.cli import main, train
from tests.subprocesses import run_python

RUN = ["model.name=mlp", "handlers.progress=false", "handlers.early_stopping=null", "handlers.writers=[jsonl]"]


def test_ember_resume_from_another_folder_resumes_that_run_and_creates_no_other(tmp_path):
    """The saved config's output is relative to where the run was started; ``ember resume`` acts on RUN_DIR."""
    from tests.subprocesses import ember_train_signalled

    started, elsewhere = tmp_path / "a", tmp_path / "b"
    started.mkdir()
    elsewhere.mkdir()
    status, _, err = ember_train_signalled(
        ["--output", "runs/digits", "trainer.max_epochs=2", "handlers.checkpoint.every_iters=7", *RUN],
        signal.SIGKILL,
        "epoch   1 ",  # a checkpoint of 7 at least is on disk: 14's save waited for it
        cwd=started,
    )
    assert status == -signal.SIGKILL, err[-3000:]
    assert "output: runs/digits" in (started / "runs" / "digits" / "config.yaml").read_text()  # relative
    done = run_python(["-m", "ember.cli", "resume", "../a/runs/digits"], cwd=elsewhere)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = re.search(
        r"^Resuming \.\./a/runs/digits from step_000000(\d\d) \(iteration (\d+)\)\.$", done.stdout, re.M
    )
    assert resumed is not None, done.stdout
    assert resumed.group(1) == resumed.group(2)
    assert int(resumed.group(2)) in (7, 14, 21, 22)
    summary = json.loads((started / "runs" / "digits" / "summary.json").read_text())
    assert (summary["iterations"], summary["run_dir"]) == (44, "../a/runs/digits")
    assert list(elsewhere.iterdir()) == []  # no run started from scratch in ./runs/digits
    again = run_python(["-m", "ember.cli", "resume", str(started / "runs" / "digits")], cwd=tmp_path)  # absolute
    assert again.returncode == 0, again.stderr[-3000:]
    assert "this run is already complete; nothing to do." in again.stdout


def test_two_runs_whose_folders_share_a_name_and_a_fast_tier_never_read_each_others_checkpoints(tmp_path):
    fast = tmp_path / "shm"
    summaries = []
    for folder, learning_rate in (("p1", 0.003), ("p2", 0.01)):
        config = {
            "model": {"name": "mlp"},
            "optimizer": {"learning_rate": learning_rate},
            "trainer": {"max_epochs": 1},
            "handlers": {"progress": False, "writers": ["jsonl"], "checkpoint": {"fast_dir": str(fast)}},
            "output": str(tmp_path / folder / "digits"),
        }
        out = io.StringIO()
        summaries.append(train(config, stream=out))
        assert "already complete" not in out.getvalue()
        run_dir = tmp_path / folder / "digits"  # the second line says where the checkpoints go
        assert out.getvalue().splitlines()[1] == f"Watching: checkpoints in {fast}, every 5th also in {run_dir}."
    assert [(s["resumed_from"], s["iterations"]) for s in summaries] == [(None, 22), (None, 22)]  # p2 trained
    ids = [(tmp_path / p / "digits" / "checkpoints" / "latest" / ".tier-id").read_text() for p in ("p1", "p2")]
    assert ids[0] != ids[1]
    assert sorted(p.name for p in fast.iterdir()) == sorted(f"latest-{i}" for i in ids)


@pytest.mark.parametrize("bad", ["''", '" "'])
def test_an_empty_fast_dir_or_output_is_refused_naming_the_field(tmp_path, capsys, bad):
    assert main(["train", f"handlers.checkpoint.fast_dir={bad}", "--output", str(tmp_path / "r")]) == 2
    shown = repr(bad.strip("'\""))
    assert (
        capsys.readouterr().err == f"ember: error: handlers.checkpoint.fast_dir: expected a folder path, got {shown}.\n"
    )
    assert main(["train", f"output={bad}"]) == 2
    assert capsys.readouterr().err == f"ember: error: output: expected a folder path, got {shown}.\n"


def test_a_tiered_store_refuses_an_empty_path_or_a_file_for_a_tier(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=re.escape("`fast` must name a folder, got '' (the working folder?).")):
        TieredStore("", tmp_path / "durable")
    with pytest.raises(ValueError, match=re.escape("`durable` must name a folder, got '' (the working folder?).")):
        TieredStore(tmp_path / "fast", "")
    with pytest.raises(ValueError, match=re.escape(f"`fast` must be a folder, got '{tmp_path / 'file'}', which is a")):
        TieredStore(tmp_path / "file", tmp_path / "durable")


@pytest.mark.parametrize(
    ("stopped", "finished"),
    [("SIGTERM", False), ("a signal on another process", False), ("early stopping", True), (None, True)],
)
def test_a_run_a_signal_stopped_on_any_process_is_not_finished_for_a_relaunch(tmp_path, stopped, finished):
    """``ember train``'s answer without JAX: a summary whose stop was a signal (here or elsewhere) trains on."""
    from ember.cli import load_config
    from ember.cli._run_record import finished_run

    summary = {"iterations": 22, "stopped": stopped}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "checkpoints" / "latest" / "step_00000022").mkdir(parents=True)
    (tmp_path / "checkpoints" / "latest" / "step_00000022" / "manifest.json").write_text("{}")
    assert finished_run(tmp_path, load_config()) == (summary if finished else None)


def test_a_mistaken_fast_dir_is_refused_before_the_run_folder_is_made(tmp_path, capsys, monkeypatch):
    """A file, a path under one, the run folder's parent or a folder inside it: one line, exit 2, no run folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes").write_text("x")
    run = tmp_path / "runs" / "digits"
    cases = {
        "notes": "handlers.checkpoint.fast_dir must be a folder, got 'notes', which is a file.",
        "notes/shm": f"handlers.checkpoint.fast_dir must be a folder, got 'notes/shm', under '{tmp_path}/notes', "
        "which is a file.",
        "runs": "handlers.checkpoint.fast_dir and the run folder must be separate folders, neither inside the other; "
        f"got '{tmp_path}/runs' and '{run}'.",
        "runs/digits/shm": "handlers.checkpoint.fast_dir and the run folder must be separate folders, neither inside "
        f"the other; got '{run}/shm' and '{run}'.",
    }
    for fast_dir, said in cases.items():
        assert main(["train", f"handlers.checkpoint.fast_dir={fast_dir}", "--output", "runs/digits"]) == 2
        assert capsys.readouterr().err == f"ember: error: {said}\n"
        assert not run.exists()  # the corrected command starts the run afresh, never "another config"
