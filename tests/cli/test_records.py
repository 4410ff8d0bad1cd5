"""A run's record survives what its state survives: SIGKILLed and relaunched, its logs are the uninterrupted run's."""

import csv
import json
import signal

import pytest

from tests.subprocesses import ember_train_signalled
from tests.writers.tb_reader import tensorboard_scalars

RUN = [
    "model.name=mlp",
    "trainer.max_epochs=3",
    "handlers.progress=false",
    "handlers.early_stopping=null",
    "handlers.writers=[tensorboard,jsonl,csv]",
    "handlers.log_every=5",
    "handlers.checkpoint.every_iters=7",  # checkpoints inside epochs too: a relaunch may resume mid-epoch
]


def ember_train(run_dir, kill_at=None):
    """``ember train`` on ``run_dir``; with ``kill_at``, SIGKILLed once a line starting with it is printed."""
    status, _, err = ember_train_signalled(["--output", str(run_dir), *RUN], signal.SIGKILL, kill_at)
    return status, err


def record(run_dir):
    """The run's logged values: the JSONL records (without their wall time), the CSV rows, TensorBoard's curves."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    jsonl = [{k: v for k, v in json.loads(line).items() if k != "time"} for line in lines]
    with (run_dir / "metrics.csv").open() as f:
        rows = list(csv.reader(f))
    return [r for r in jsonl if "step" in r], rows, tensorboard_scalars(run_dir / "tb")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    status, err = ember_train(run_dir)
    assert status == 0, err[-3000:]
    return record(run_dir)


@pytest.mark.parametrize(
    "kill_at",
    [
        "Training on",  # before the first checkpoint: the relaunch starts over
        "epoch   1 ",  # the first evaluation printed, its epoch's checkpoint being written
        "epoch   2 ",
    ],
)
def test_after_a_sigkill_and_a_relaunch_the_logs_hold_each_record_of_the_uninterrupted_run_once(
    tmp_path, uninterrupted, kill_at
):
    run_dir = tmp_path / "run"
    status, err = ember_train(run_dir, kill_at)
    assert status == -signal.SIGKILL, err[-3000:]
    status, err = ember_train(run_dir)
    assert status == 0, err[-3000:]
    jsonl, rows, curves = record(run_dir)
    expected_jsonl, expected_rows, expected_curves = uninterrupted
    assert [r["step"] for r in jsonl] == [r["step"] for r in expected_jsonl]
    assert jsonl == expected_jsonl  # the values too: the resumed run is exact
    assert rows == expected_rows
    assert sorted(curves) == ["train/loss", "train/lr", "val/accuracy", "val/loss"]
    assert curves == expected_curves  # as TensorBoard shows them: the killed launch's steps past the checkpoint purged


def test_every_record_up_to_a_checkpoint_is_fsynced_before_that_checkpoint_commits(tmp_path, monkeypatch):
    """Issue 44: when a checkpoint of step S is committed, every record up to S is on disk, fsynced.

    A power loss after the commit loses no record the checkpoint covers. Each file's fsync is seen before each commit.
    """
    import os
    import threading

    import ember.checkpoint._store as store_module
    from ember import Engine, Events
    from ember.cli._run_checkpoints import attach_checkpoints, close_stores
    from ember.cli._schema import CheckpointConfig
    from ember.writers import create_run_writer

    seen, lock = [], threading.Lock()
    real_fsync, real_commit = os.fsync, store_module.commit

    def fsync(fd):
        with lock:
            seen.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_fsync(fd)

    def commit(tmp, final, **kwargs):
        with lock:
            seen.append(("commit", final.name))
        return real_commit(tmp, final, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(store_module, "commit", commit)
    run_dir = tmp_path / "run"
    records = create_run_writer(run_dir, ["jsonl", "csv", "tensorboard"])
    trainer, evaluator = Engine(lambda e, b: b), Engine(lambda e, b: b)

    @trainer.on(Events.ITERATION_COMPLETED)
    def log(engine):
        records.write_scalars(engine.state.iteration, {"x": 1})
        with lock:
            seen.append(("logged", f"step_{engine.state.iteration:08d}"))

    to_save = {"trainer": trainer}
    best, latest = attach_checkpoints(CheckpointConfig(), run_dir, to_save, trainer, evaluator, records)
    trainer.run([1, 2], max_epochs=2)
    close_stores(best, latest)
    records.close()
    commits = [i for i, (kind, name) in enumerate(seen) if kind == "commit" and name.startswith("step_")]
    assert [seen[i][1] for i in commits] == ["step_00000002", "step_00000004"]
    for i in commits:  # between logging step S and committing its checkpoint (not the commit before: it may lag)
        logged = seen.index(("logged", seen[i][1]))
        synced = {name for kind, name in seen[logged:i] if kind == "fsync"}
        assert {"metrics.jsonl", "metrics.csv"} <= synced, seen[logged:i]
        assert any(name.startswith("events.out.tfevents") for name in synced), seen[logged:i]


EVERY_OTHER = ["trainer.eval_every=2"]  # epoch 3 ends without a validation: the run's result is epoch 2's


@pytest.fixture(scope="module")
def uninterrupted_every_other(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight-every-other") / "run"
    status, _, err = ember_train_signalled(["--output", str(run_dir), *RUN, *EVERY_OTHER])
    assert status == 0, err[-3000:]
    return record(run_dir), json.loads((run_dir / "summary.json").read_text())


def test_a_run_stopped_by_sigterm_and_relaunched_holds_the_uninterrupted_runs_record_its_hparams_once(
    tmp_path, uninterrupted_every_other
):
    """A stop is not the run's end: one hparams record, the relaunch's, with the run's last validation.

    The stop (in epoch 3, after epoch 2's validation) writes no hparams; the relaunch, which does not validate again,
    writes the run's one hparams record with epoch 2's numbers, and its summary's final accuracy is theirs.
    """
    run_dir = tmp_path / "run"
    args = ["--output", str(run_dir), *RUN, *EVERY_OTHER]
    status, _, err = ember_train_signalled(args, signal.SIGTERM, "epoch   2 ")
    assert status == 143, err[-3000:]
    assert not [r for r in record(run_dir)[0] if "hparams" in r]  # a stop is not the run's end
    status, _, err = ember_train_signalled(args)
    assert status == 0, err[-3000:]
    (expected_jsonl, expected_rows, expected_curves), expected_summary = uninterrupted_every_other
    jsonl, rows, curves = record(run_dir)
    hparams = [r for r in jsonl if "hparams" in r]
    assert len(hparams) == 1
    assert sorted(hparams[0]["metrics"]) == ["val/accuracy", "val/loss"]
    assert jsonl == expected_jsonl
    assert rows == expected_rows
    assert curves == expected_curves  # no validation point at the stop's step
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_accuracy"] == expected_summary["final_accuracy"] == hparams[0]["metrics"]["val/accuracy"]
