"""`ember train`'s `evaluations:` section: more evaluations beside val, each under its name, through a relaunch."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from sklearn.datasets import load_digits

from ember.cli import ConfigError, load_config, main, train
from tests.subprocesses import PYTHONPATH, devices, ember_train_signalled, end_group, run_python


def config(tmp_path, **evaluations):
    return {
        "model": {"name": "mlp"},
        "trainer": {"max_epochs": 2},
        "handlers": {
            "progress": False,
            "early_stopping": None,
            "writers": ["jsonl"],
            "log_every": 100,
            "checkpoint": {"best_on": "val_noisy", "keep_best": 2},
        },
        "evaluations": evaluations,
        "output": str(tmp_path / "run"),
    }


def logged(run_dir) -> list[tuple[str, int]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return sorted((k, r["step"]) for r in rows if "hparams" not in r for k in r if k.split("/")[0].startswith("val"))


def test_a_second_evaluation_on_its_own_schedule_is_logged_scores_the_best_and_survives_a_relaunch(tmp_path):
    cfg = config(tmp_path, val_noisy={"noise": 0.5, "every_epochs": None, "every_iters": 10})
    summary = train(cfg)
    assert (summary["iterations"], summary["best_on"]) == (44, "val_noisy")  # two epochs of 22
    run = tmp_path / "run"
    expected = sorted(
        [(f"val/{m}", s) for m in ("accuracy", "loss") for s in (22, 44)]
        + [(f"val_noisy/{m}", s) for m in ("accuracy", "loss") for s in (10, 20, 30, 40)]
    )
    assert logged(run) == expected
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    noisy = {r["step"]: r["val_noisy/accuracy"] for r in rows if "val_noisy/accuracy" in r}
    best = sorted(p.name for p in (run / "checkpoints" / "best").iterdir())
    ranked = sorted(noisy.items(), key=lambda item: -item[1])[:2]
    assert best == sorted(f"step_{s:08d}-val_noisy_accuracy={a:.4f}" for s, a in ranked)
    # the run dies after its last checkpoint's records: the relaunch from step 22 logs 30 and 40 again, once each
    shutil.rmtree(run / "checkpoints" / "latest" / "step_00000044")
    (run / "summary.json").unlink()
    assert train(cfg)["resumed_from"] == 22
    assert logged(run) == expected
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    again = {r["step"]: r["val_noisy/accuracy"] for r in rows if "val_noisy/accuracy" in r}
    assert again == noisy  # the same evaluations, bit for bit


def test_an_evaluation_on_every_schedule_at_once_runs_once_at_each_iteration_due(tmp_path):
    """Every epoch (22 iterations), every 11, at 5 and 11, and every hour: 5, 11, 22, each once."""
    schedule = {"every_epochs": 1, "every_iters": 11, "at_iters": [11, 5], "every_secs": 3600}
    cfg = config(tmp_path, val_noisy=schedule)
    cfg["trainer"]["max_epochs"] = 1
    train(cfg)
    expected = [(f"val/{m}", 22) for m in ("accuracy", "loss")]
    expected += [(f"val_noisy/{m}", s) for m in ("accuracy", "loss") for s in (5, 11, 22)]
    assert logged(tmp_path / "run") == sorted(expected)


def test_early_stopping_on_a_named_evaluation_stops_at_its_first_evaluation_without_improvement(tmp_path):
    cfg = config(tmp_path, val_noisy={"noise": 2.0, "every_epochs": None, "every_iters": 3})
    cfg["trainer"]["max_epochs"] = 3
    cfg["handlers"]["early_stopping"] = {"on": "val_noisy", "patience": 1}
    summary = train(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    noisy = [(r["step"], r["val_noisy/accuracy"]) for r in rows if "val_noisy/accuracy" in r]
    best = [max(a for _, a in noisy[: i + 1]) for i in range(len(noisy))]
    first_worse = next(step for i, (step, a) in enumerate(noisy) if i > 0 and a <= best[i - 1])
    assert summary["iterations"] == noisy[-1][0] == first_worse < 66  # stopped there, before the end


def test_an_evaluation_of_a_folder_of_npy_files(tmp_path):
    digits = load_digits()
    folder = tmp_path / "held_out"
    folder.mkdir()
    np.save(folder / "x.npy", (digits.images[-100:, ..., None] / 16).astype("float32"))
    np.save(folder / "y.npy", digits.target[-100:].astype("int32"))
    cfg = config(tmp_path, val_noisy={"data": str(folder)})
    cfg["trainer"]["max_epochs"] = 1
    assert train(cfg)["iterations"] == 22
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], 0.5 < r["val_noisy/accuracy"] <= 1.0) for r in rows if "val_noisy/accuracy" in r] == [
        (22, True)
    ]


@pytest.mark.parametrize(
    ("evaluations", "best_on", "message"),
    [
        ({"val": {}}, "val", "evaluations.val: expected a name without '/', other than 'val', got 'val'."),
        ({"a": {"every_epochs": None}}, "val", "evaluations.a: give every_epochs, every_iters, every_secs or at_iters"),
        ({"a": {"at_iters": [5, 0]}}, "val", "evaluations.a.at_iters: expected positive ints, got [5, 0]."),
        ({"a": {"every_secs": 0}}, "val", "evaluations.a.every_secs: expected a positive number of seconds (or null)"),
        ({"a": {"noise": -1}}, "val", "evaluations.a.noise: expected a number >= 0, got -1.0."),
        ({"a": {"every_iters": 0}}, "val", "evaluations.a.every_iters: expected a positive int, got 0."),
        ({"a": {}}, "b", "handlers.checkpoint.best_on: expected an evaluation of the run (val, a), got 'b'."),
        ({"a": {}}, "val", "handlers.early_stopping.on: expected an evaluation of the run (val, a), got 'c'."),
    ],
)
def test_bad_evaluations_are_refused_when_the_config_is_read(tmp_path, evaluations, best_on, message):
    cfg = config(tmp_path, **evaluations)
    cfg["handlers"]["checkpoint"]["best_on"] = best_on
    cfg["handlers"]["early_stopping"] = {"on": "c"} if "early_stopping" in message else None
    with pytest.raises(ConfigError) as raised:
        load_config(cfg)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    "damage",
    [
        '{"evaluated": [5, 10], "mis',
        "[5, 10]",
        '{"evaluated": ["5"], "missed": []}',
        '{"evaluated": [5.0], "missed": []}',
        "dir",
    ],
)
def test_a_damaged_watch_json_holds_every_checkpoint_for_its_watcher(tmp_path, damage):
    """Torn, of another shape, steps that are not ints, a folder in its place: what the watcher read is not known."""
    from ember.cli._evaluations.watcher import unread_by

    (tmp_path / "eval" / "w").mkdir(parents=True)
    state = tmp_path / "eval" / "w" / "watch.json"
    if damage == "dir":
        state.mkdir()
    else:
        state.write_text(damage)
    (tmp_path / "eval" / "ok").mkdir()
    (tmp_path / "eval" / "ok" / "watch.json").write_text(json.dumps({"evaluated": [5, 10], "missed": [15]}))
    assert [unread_by(tmp_path, ["w"])(step) for step in (1, 5, 10, 20)] == [True, True, True, True]
    assert [unread_by(tmp_path, ["ok"])(step) for step in (1, 5, 15, 20)] == [False, False, False, True]


def test_the_newest_latest_checkpoint_decides_whether_a_run_keeps_its_saved_steps(tmp_path):
    """kept_in: a run whose newest checkpoint lacks the saved steps goes on without, whatever an older one held."""
    from ember.checkpoint import CheckpointStore
    from ember.cli._evaluations.saved_steps import KEY, kept_in

    with_steps = {"state_dicts": {"trainer": {}, KEY: {"steps": [1], "at": 1}}}
    without = {"state_dicts": {"trainer": {}}}
    older_has = CheckpointStore(tmp_path / "a")
    older_has.save({"w": np.zeros(1)}, step=1, metadata=with_steps)
    older_has.save({"w": np.zeros(1)}, step=2, metadata=without)
    newest_has = CheckpointStore(tmp_path / "b")
    newest_has.save({"w": np.zeros(1)}, step=1, metadata=without)
    newest_has.save({"w": np.zeros(1)}, step=2, metadata=with_steps)
    assert (kept_in(KEY, older_has), kept_in(KEY, newest_has), kept_in(KEY, newest_has, older_has)) == (
        False,
        True,
        False,
    )
    assert kept_in(KEY, CheckpointStore(tmp_path / "new"))  # a new run keeps them


def test_a_bad_watcher_name_to_keep_checkpoints_for_is_refused_when_the_config_is_read(tmp_path):
    cfg = config(tmp_path, val_noisy={})
    cfg["handlers"]["checkpoint"]["keep_for_watchers"] = ["w", "a/b"]
    message = "handlers.checkpoint.keep_for_watchers: expected watcher names of letters, digits, '_', '.' and '-', got"
    with pytest.raises(ConfigError, match=re.escape(f"{message} 'a/b'.")):
        load_config(cfg)


def test_a_folder_without_its_labels_is_refused_before_training(tmp_path):
    (tmp_path / "x.npy").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"evaluations.val_noisy.data: expected 'val' or a folder .* lacks y.npy"):
        train(config(tmp_path, val_noisy={"data": str(tmp_path)}))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_ember_eval_evaluates_a_checkpoint_of_the_run_as_the_run_did(tmp_path, capsys):
    """`ember eval RUN_DIR --checkpoint STEP`: each evaluation of the run on that checkpoint, as the run did it."""
    cfg = config(tmp_path, val_noisy={"noise": 0.5, "every_epochs": None, "every_iters": 10})
    cfg["trainer"]["max_epochs"] = 1
    cfg["handlers"]["checkpoint"] |= {"every_iters": 10, "keep_latest": 5}
    train(cfg)
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    recorded = {(k, r["step"]): v for r in rows for k, v in r.items() if k.startswith("val")}
    capsys.readouterr()
    assert main(["eval", str(run), "--checkpoint", "20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["step_00000020 (iteration 20)"] * 2
    evaluated = json.loads((run / "eval.jsonl").read_text())
    assert evaluated["step"] == 20
    assert evaluated["val_noisy/accuracy"] == recorded[("val_noisy/accuracy", 20)]  # as the run evaluated it
    assert evaluated["val_noisy/loss"] == recorded[("val_noisy/loss", 20)]
    assert main(["eval", str(run)]) == 0  # the latest: the epoch's end, where the run evaluated val
    latest = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()][-1]
    assert (latest["step"], latest["val/accuracy"], latest["val/loss"]) == (
        22,
        recorded[("val/accuracy", 22)],
        recorded[("val/loss", 22)],
    )
    assert main(["eval", str(run), "--checkpoint", "15"]) == 2
    assert (
        capsys.readouterr().err.strip().endswith(f"{run} holds no checkpoint of step 15; it holds steps [10, 20, 22].")
    )
    assert main(["eval", str(run), "--checkpoint", "newest"]) == 2
    assert "`--checkpoint` must be latest, best or a step (an int), got 'newest'." in capsys.readouterr().err
    assert main(["eval", str(tmp_path)]) == 2
    assert "has no config.yaml; is it a run folder of ember train?" in capsys.readouterr().err


WATCH = ["--watch", "--name", "w", "--poll", "0.2"]


def finished_run(tmp_path):
    """One epoch (22 iterations) with a checkpoint every 5; the noisy evaluation every 10."""
    cfg = config(tmp_path, val_noisy={"noise": 0.5, "every_epochs": None, "every_iters": 10})
    cfg["trainer"]["max_epochs"] = 1
    cfg["handlers"]["checkpoint"] |= {"every_iters": 5, "keep_latest": 10}
    train(cfg)
    return tmp_path / "run"


def watched(run):
    rows = [json.loads(line) for line in (run / "eval" / "w" / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows], rows, json.loads((run / "eval" / "w" / "watch.json").read_text())


def test_a_watcher_killed_and_relaunched_evaluates_each_checkpoint_once_in_order(tmp_path):
    run = finished_run(tmp_path)
    recorded = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    status, _, _ = ember_train_signalled([str(run), *WATCH], signal.SIGKILL, "step_00000010", command="eval")
    assert status == -signal.SIGKILL
    status, out, err = ember_train_signalled([str(run), *WATCH], command="eval")
    assert status == 0, err[-3000:]
    assert out.splitlines()[-1] == "The run has ended: 5 checkpoints evaluated."
    steps, rows, state = watched(run)
    assert steps == [5, 10, 15, 20, 22]  # each once, in order, through the kill
    assert state == {"evaluated": [5, 10, 15, 20, 22], "missed": []}
    for row in rows:  # what the run itself logged at those steps, bit for bit, from another process
        for name in {"val_noisy/accuracy", "val/accuracy"} & set(recorded.get(row["step"], {})):
            assert row[f"w/{name}"] == recorded[row["step"]][name]
    assert sum(f"w/{n}" in row for row in rows for n in ("val_noisy/accuracy", "val/accuracy")) == 2 * 5


def test_a_checkpoint_deleted_before_the_watcher_read_it_is_reported(tmp_path, monkeypatch, capsys):
    from ember.cli._evaluations import watcher

    run = finished_run(tmp_path)
    listed = watcher._committed

    def retention_between(run_dir):  # the training run's retention deletes step 15 once the watcher listed it
        found = listed(run_dir)
        if 15 in found:  # the first listing holds it; it is gone from every later one
            shutil.rmtree(found[15].path)
        return found

    monkeypatch.setattr(watcher, "_committed", retention_between)
    assert main(["eval", str(run), *WATCH]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "step_00000015: deleted before it was evaluated; reported in watch.json" in out
    assert out[-1] == "The run has ended: 4 checkpoints evaluated; deleted before they were evaluated: [15]."
    steps, _, state = watched(run)
    assert steps == [5, 10, 20, 22]
    assert state == {"evaluated": [5, 10, 20, 22], "missed": [15]}


def test_a_watcher_beside_a_live_run_killed_and_relaunched_evaluates_every_checkpoint_it_commits_once(tmp_path):
    """The watcher evaluates while the run trains, committed checkpoints only, each once, and ends with the run.

    It is SIGKILLed as it evaluates the first checkpoint, and relaunched. The run's data (`gated_data.py`) holds it
    at its tenth step until the watcher has evaluated a checkpoint, so the two overlap on any machine, however busy;
    every wait is bounded.
    """
    run = tmp_path / "run"
    args = ["model.name=mlp", "data.name=grain", "data.path=tests.cli.gated_data:make", "trainer.max_epochs=3"]
    args += ["handlers.early_stopping=null", "handlers.progress=false", "handlers.writers=[jsonl]"]
    args += ["handlers.checkpoint.every_iters=4", "handlers.checkpoint.keep_latest=100", f"--output={run}"]
    state = run / "eval" / "w" / "watch.json"
    training = subprocess.Popen(
        [sys.executable, "-m", "ember.cli", "train", *args],
        env={**os.environ, "PYTHONPATH": PYTHONPATH, "EMBER_TEST_GATE": str(state)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    watcher: dict[str, tuple[int, str, str]] = {}
    try:
        deadline = time.monotonic() + 120
        while not (run / "config.yaml").exists():  # written before the first step
            assert training.poll() is None, training.stderr.read()  # type: ignore[union-attr]
            assert time.monotonic() < deadline
            time.sleep(0.05)

        def watch() -> None:  # killed once as it evaluates step 4, then relaunched
            watcher["killed"] = ember_train_signalled(
                [str(run), *WATCH], signal.SIGKILL, "step_00000004", command="eval"
            )
            watcher["done"] = ember_train_signalled([str(run), *WATCH], command="eval")

        thread = threading.Thread(target=watch)
        thread.start()
        assert training.wait(timeout=240) == 0, training.stderr.read()  # type: ignore[union-attr]
        thread.join(timeout=240)
    finally:
        end_group(training.pid)
        training.communicate(timeout=30)
    assert watcher["killed"][0] == -signal.SIGKILL
    status, _, err = watcher["done"]
    assert status == 0, err[-3000:]
    committed = sorted(int(p.name[5:13]) for p in (run / "checkpoints" / "latest").iterdir())
    steps, _, state = watched(run)
    assert steps == state["evaluated"] == committed  # every multiple of 4 and each epoch's end, once, in order
    assert committed == sorted(set(range(4, 64, 4)) | {21, 42, 63})


def test_checkpoints_a_watcher_has_not_read_are_kept_past_keep_latest_and_go_once_it_has(tmp_path, capsys):
    cfg = config(tmp_path, val_noisy={"noise": 0.5})
    cfg["trainer"]["max_epochs"] = 1
    cfg["handlers"]["checkpoint"] |= {"every_iters": 5, "keep_latest": 2, "keep_for_watchers": ["w"]}
    run = tmp_path / "run"
    (run / "eval" / "w").mkdir(parents=True)
    (run / "eval" / "w" / "watch.json").write_text(json.dumps({"evaluated": [5], "missed": []}))
    latest = lambda: sorted(int(p.name[5:13]) for p in (run / "checkpoints" / "latest").iterdir())  # noqa: E731
    train(cfg)
    assert latest() == [10, 15, 20, 22]  # the newest two, and 10 and 15, which the watcher has yet to read
    shutil.rmtree(run / "checkpoints" / "latest" / "step_00000022")  # killed before its last save: relaunched,
    (run / "summary.json").unlink()  # it saves 22 again: 10 and 15 are still unread and stay
    assert train(cfg)["resumed_from"] == 20
    assert latest() == [10, 15, 20, 22]
    (run / "eval" / "w" / "watch.json").write_text(json.dumps({"evaluated": [5, 10], "missed": []}))
    shutil.rmtree(run / "checkpoints" / "latest" / "step_00000022")  # again, once the watcher has read 10:
    (run / "summary.json").unlink()  # the save of 22 removes 10, and keeps 15
    assert train(cfg)["resumed_from"] == 20
    assert latest() == [15, 20, 22]
    capsys.readouterr()
    assert main(["eval", str(run), *WATCH]) == 0  # the run has ended: what it kept for the watcher, once read, goes
    assert watched(run)[2] == {"evaluated": [5, 10, 15, 20, 22], "missed": []}  # none missed
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "Removed 1 checkpoint kept for the watchers until read: [15].",
        "The run has ended: 5 checkpoints evaluated.",
    ]
    assert latest() == [20, 22]
    (run / "eval" / "w" / "watch.json").unlink()  # a watcher not started: every checkpoint is kept for it
    shutil.rmtree(run)
    train(cfg)
    assert latest() == [5, 10, 15, 20, 22]


def test_a_watcher_of_a_tiered_run_evaluates_the_checkpoints_of_its_durable_tier(tmp_path):
    """The fast tier is each training process's local folder; the run folder's durable tier is what a job can read.

    Saves at 5, 10, 15, 20 and 22; every second one and the last go into the durable tier, which keeps two: 10 was
    deleted before the watcher started, and is reported; 5 and 15 were never durable, and are not.
    """
    cfg = config(tmp_path, val_noisy={})
    cfg["trainer"]["max_epochs"] = 1
    fast = {"fast_dir": str(tmp_path / "fast"), "durable_every": 2, "every_iters": 5, "keep_latest": 2}
    cfg["handlers"]["checkpoint"] |= fast | {"best_on": "val"}  # the best store holds 22 only
    train(cfg)
    assert main(["eval", str(tmp_path / "run"), *WATCH]) == 0
    assert watched(tmp_path / "run")[2] == {"evaluated": [20, 22], "missed": [10]}


def test_checkpoints_deleted_before_the_watcher_listed_them_are_reported_or_read_from_the_best_store(tmp_path, capsys):
    """A watcher started after the run: retention kept 20 and 22 of the latest; 10 and 20 are the best two.

    Each latest checkpoint names the steps saved before it, through a relaunch: 5 and 15 are reported missed, 10 is
    read from the best store, with the numbers the run logged.
    """
    cfg = config(tmp_path, val_noisy={"noise": 0.5, "every_epochs": None, "every_iters": 10})
    cfg["trainer"]["max_epochs"] = 1
    cfg["handlers"]["checkpoint"] |= {"every_iters": 5, "keep_latest": 2}
    train(cfg)
    run = tmp_path / "run"
    shutil.rmtree(run / "checkpoints" / "latest" / "step_00000022")  # killed before its last save: relaunched
    (run / "summary.json").unlink()
    assert train(cfg)["resumed_from"] == 20
    recorded = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    capsys.readouterr()
    assert main(["eval", str(run), *WATCH]) == 0
    out = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()]
    best_10 = next(p.name for p in (run / "checkpoints" / "best").iterdir() if p.name.startswith("step_00000010"))
    assert out == [
        "step_00000005",
        *[f"{best_10} (iteration 10)"] * 2,
        "step_00000015",
        *["step_00000020 (iteration 20)"] * 2,
        *["step_00000022 (iteration 22)"] * 2,
        "The run has ended",
    ]
    steps, rows, state = watched(run)
    assert steps == state["evaluated"] == [10, 20, 22]
    assert state["missed"] == [5, 15]
    assert rows[0]["w/val_noisy/accuracy"] == recorded[10]["val_noisy/accuracy"]


def test_a_run_begun_without_saved_steps_resumes_and_goes_on_without_them(tmp_path, monkeypatch):
    """A run folder whose checkpoints hold no saved steps (made before ember kept them) resumes as it was made."""
    from ember.cli import _run_checkpoints

    cfg = config(tmp_path, val_noisy={})
    cfg["trainer"]["max_epochs"] = 1
    cfg["handlers"]["checkpoint"] |= {"every_iters": 5, "keep_latest": 2}
    with monkeypatch.context() as patched:
        patched.setattr(_run_checkpoints, "kept_in", lambda *stores: False)
        train(cfg)
    run = tmp_path / "run"
    shutil.rmtree(run / "checkpoints" / "latest" / "step_00000022")  # killed before its last save: relaunched
    (run / "summary.json").unlink()
    assert train(cfg)["resumed_from"] == 20
    newest = json.loads((run / "checkpoints" / "latest" / "step_00000022" / "manifest.json").read_text())
    assert sorted(newest["metadata"]["state_dicts"]) == ["trainer"]
    assert main(["eval", str(run), *WATCH]) == 0
    assert watched(run)[2] == {"evaluated": [20, 22], "missed": []}  # 5, 10 and 15 went unseen, as before


def test_a_record_written_before_a_kill_marked_it_evaluated_is_dropped_and_written_again(tmp_path, capsys):
    """Killed between its metrics and watch.json: the relaunch drops the record and evaluates that step again."""
    run = finished_run(tmp_path)
    assert main(["eval", str(run), *WATCH]) == 0
    state_file = run / "eval" / "w" / "watch.json"
    state_file.write_text(json.dumps({"evaluated": [5, 10, 15, 20], "missed": []}))  # 22's record is on disk
    capsys.readouterr()
    assert main(["eval", str(run), *WATCH]) == 0
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == [
        "step_00000022 (iteration 22)",
        "step_00000022 (iteration 22)",
        "The run has ended",
    ]
    steps, _, state = watched(run)
    assert steps == [5, 10, 15, 20, 22]
    assert state == {"evaluated": [5, 10, 15, 20, 22], "missed": []}


def test_a_watcher_of_two_processes_one_killed_ends_the_other_and_the_relaunch_evaluates_each_checkpoint_once(
    tmp_path,
):
    """Two processes (one device each) watch a one-device run; process 1 SIGKILLed: 0 exits 75; relaunched: done.

    The run's summary is held back while the watcher is killed, so it is still watching whenever the kill lands.
    """
    from tests.cli.test_distributed import finish, kill_the_second_once, output, start

    run = finished_run(tmp_path)
    recorded = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    summary = (run / "summary.json").read_text()
    (run / "summary.json").unlink()
    command = ["eval", "--distributed", str(run), *WATCH]
    state = run / "eval" / "w" / "watch.json"
    two = lambda: state.exists() and len(json.loads(state.read_text())["evaluated"]) >= 2  # noqa: E731
    message = kill_the_second_once(start(run, command=command), run, two, "the watcher evaluated no two checkpoints")
    assert message.endswith("relaunching resumes from what it recorded. Relaunch every process.")
    (run / "summary.json").write_text(summary)
    assert finish(start(run, command=command)) == [0, 0], output(run, 0, "err")[-3000:]
    assert output(run, 0).splitlines()[-1] == "The run has ended: 5 checkpoints evaluated."
    assert [line for line in output(run, 1).splitlines() if line.startswith(("step_", "The run"))] == []
    steps, rows, state = watched(run)
    assert steps == state["evaluated"] == [5, 10, 15, 20, 22]  # each once, in order, through the kill
    for row in rows:  # on two devices of two processes, the accuracy the one-device run logged at that step
        if "val/accuracy" in recorded.get(row["step"], {}):
            assert row["w/val/accuracy"] == recorded[row["step"]]["val/accuracy"]


def test_ember_eval_restores_onto_another_device_count(tmp_path):
    """A run trained on one device, evaluated on four with a data-parallel placement: the same accuracy."""
    run = finished_run(tmp_path)
    recorded = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    at_22 = next(r for r in recorded if r["step"] == 22 and "val/accuracy" in r)
    done = run_python(
        ["-m", "ember.cli", "eval", str(run), "trainer.placement=data_parallel", "data.batch_size=64"],
        env={"XLA_FLAGS": devices(4)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    evaluated = json.loads((run / "eval.jsonl").read_text())
    assert evaluated["step"] == 22
    assert evaluated["val/accuracy"] == at_22["val/accuracy"]  # a count: exact on any layout
    assert evaluated["val/loss"] == pytest.approx(at_22["val/loss"], rel=1e-5)  # a sum: in another order


def truncate(path):
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)


@pytest.mark.parametrize("fault", ["truncated", "manifest damaged", "deleted"])
def test_the_runs_last_checkpoint_unreadable_is_reported_with_the_true_reason(tmp_path, capsys, fault):
    """The run's last checkpoint (no later one names it) truncated, its manifest damaged, or deleted: reported."""
    run = finished_run(tmp_path)
    shutil.rmtree(run / "checkpoints" / "best")  # no other copy of step 22 to read instead
    last = run / "checkpoints" / "latest" / "step_00000022"
    if fault == "truncated":
        truncate(last / "state.msgpack")
    elif fault == "manifest damaged":
        (last / "manifest.json").write_text('{"step": 22, "fi')
    else:
        shutil.rmtree(last)
    assert main(["eval", str(run), *WATCH]) == 0
    out = capsys.readouterr().out.splitlines()
    steps, _, state = watched(run)
    assert steps == [5, 10, 15, 20]
    assert (state["evaluated"], state["missed"]) == ([5, 10, 15, 20], [22])
    if fault == "deleted":
        assert "step_00000022: deleted before it was evaluated; reported in watch.json" in out
        assert out[-1] == "The run has ended: 4 checkpoints evaluated; deleted before they were evaluated: [22]."
        assert "damaged" not in state
        return
    why = state["damaged"]["22"]
    assert why.startswith(f"Checkpoint '{last}' is corrupt: its ")
    assert ("state.msgpack" if fault == "truncated" else "manifest.json") in why
    assert f"step_00000022: damaged, not evaluated ({why}); reported in watch.json" in out
    assert out[-1] == "The run has ended: 4 checkpoints evaluated; damaged, not evaluated: [22]."
    assert last.is_dir()  # the run's folder is the training job's: the watcher reads it, never moves it


def test_a_damaged_checkpoint_is_reported_as_damaged_not_deleted(tmp_path, capsys):
    run = finished_run(tmp_path)
    shutil.rmtree(run / "checkpoints" / "best")  # no other copy of step 10 to read instead
    bits = bytearray((run / "checkpoints" / "latest" / "step_00000010" / "state.msgpack").read_bytes())
    bits[len(bits) // 2] ^= 0xFF  # a bit flipped: listed (the sizes check out), refused by its CRC at the restore
    (run / "checkpoints" / "latest" / "step_00000010" / "state.msgpack").write_bytes(bytes(bits))
    assert main(["eval", str(run), *WATCH]) == 0
    out = capsys.readouterr().out.splitlines()
    steps, _, state = watched(run)
    assert steps == [5, 15, 20, 22]
    assert state["missed"] == [10]
    assert state["damaged"]["10"].endswith("its state.msgpack does not match the checksum in manifest.json.")
    assert out[-1] == "The run has ended: 4 checkpoints evaluated; damaged, not evaluated: [10]."
