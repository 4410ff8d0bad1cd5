"""One tracker run per run: ``ember train`` continues its MLflow and W&B runs across relaunches, with their status."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.subprocesses import PYTHONPATH, ROOT, ember_train_signalled
from tests.writers.wandb_reader import config_and_summary, exit_codes, history, read_records

RUN = [
    "model.name=mlp",
    "trainer.max_epochs=3",
    "handlers.progress=false",
    "handlers.early_stopping=null",
    "handlers.log_every=5",
    "handlers.checkpoint.every_iters=7",  # a relaunch resumes mid-epoch: the killed launch logged steps past it
]


@pytest.fixture(autouse=True)
def own_wandb_service(monkeypatch):
    """Each ``ember train`` starts its own W&B process.

    One this test process started (a W&B test before) would be shared through ``WANDB_SERVICE``, and a killed
    launch's run would stay open in it ("run ID ... is in use").
    """
    monkeypatch.delenv("WANDB_SERVICE", raising=False)


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    """An MLflow sqlite store for the module (its tables made once) and the environment that points at it."""
    folder = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    with _sqlalchemy_quiet():
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)  # creates the tables
        for experiment in ("ember", "failing", "watched"):  # artifacts in the test's folder, not MLflow's ./mlruns
            client.create_experiment(experiment, artifact_location=(folder / experiment).as_uri())
    return {"MLFLOW_TRACKING_URI": uri}


class _sqlalchemy_quiet:
    """MLflow's sqlite store under SQLAlchemy 2.1 warns of its own deprecated calls; they are not ember's."""

    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.filterwarnings("ignore", module="sqlalchemy")
        warnings.filterwarnings("ignore", message=".*noload.*")
        return self

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)


def mlflow_runs(tracking, experiment="ember"):
    """``[(name, status, {metric: [(step, value), ...]}, artifacts)]`` of the experiment's runs, oldest first."""
    from mlflow.tracking import MlflowClient

    with _sqlalchemy_quiet():
        client = MlflowClient(tracking_uri=tracking["MLFLOW_TRACKING_URI"])
        found = client.get_experiment_by_name(experiment)
        runs = sorted(client.search_runs([found.experiment_id]), key=lambda r: r.info.start_time)
        return [
            (
                r.info.run_name,
                r.info.status,
                {
                    name: [(m.step, m.value) for m in sorted(client.get_metric_history(r.info.run_id, name), key=_step)]
                    for name in sorted(r.data.metrics)
                },
                sorted(a.path for a in client.list_artifacts(r.info.run_id)),
            )
            for r in runs
        ]


def _step(m):
    return m.step, m.timestamp


def ember_train(run_dir, env, writers="jsonl,mlflow", sig=None, at=None):
    """``ember train`` into ``run_dir`` with ``env`` set; ``sig`` once a line starting with ``at`` is printed."""
    return ember_train_signalled(["--output", str(run_dir), *RUN, f"handlers.writers=[{writers}]"], sig, at, env=env)


def test_a_killed_and_relaunched_run_is_one_mlflow_run_with_each_step_once_and_the_right_status(tmp_path, tracking):
    """SIGKILL, relaunch, Ctrl-C, relaunch: one run, RUNNING -> KILLED -> FINISHED, the uninterrupted run's points."""
    straight = ember_train(tmp_path / "straight", tracking)
    assert straight[0] == 0, straight[2][-3000:]
    run_dir = tmp_path / "broken"
    killed = ember_train(run_dir, tracking, sig=signal.SIGKILL, at="epoch   1 ")
    assert killed[0] == -signal.SIGKILL, killed[2][-3000:]
    assert mlflow_runs(tracking)[1][:2] == ("broken", "RUNNING")  # died without a word: the relaunch continues it
    stopped = ember_train(run_dir, tracking, sig=signal.SIGINT, at="epoch   2 ")
    assert stopped[0] == 130, stopped[2][-3000:]
    assert mlflow_runs(tracking)[1][:2] == ("broken", "KILLED")
    done = ember_train(run_dir, tracking)
    assert done[0] == 0, done[2][-3000:]

    runs = mlflow_runs(tracking)  # one experiment for the config's runs: both in one table
    assert [(name, status) for name, status, _, _ in runs] == [("straight", "FINISHED"), ("broken", "FINISHED")]
    (_, _, expected, artifacts), (_, _, metrics, _) = runs
    assert sorted(metrics) == ["train/loss", "train/lr", "val/accuracy", "val/loss"]
    assert [s for s, _ in metrics["train/loss"]] == list(range(5, 67, 5))  # each step once, across three launches
    assert metrics == expected  # the values too: the resumed run is exact
    assert artifacts == ["config.yaml", "summary.json"]  # not the checkpoints
    assert json.loads((run_dir / "run.json").read_text())["trackers"]["mlflow"]


def test_a_run_stopped_by_sigterm_and_relaunched_has_the_uninterrupted_runs_params_and_results_in_each_tracker(
    tmp_path, tracking
):
    """Every tracker's record of a stopped and relaunched run is the uninterrupted run's (its folder's path aside).

    Stopped in epoch 3 (after epoch 2's validation, none after): MLflow's params and metrics, W&B's config and
    summary, the JSONL's one hparams record.
    """
    env = {**tracking, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    args = [*RUN, "handlers.writers=[jsonl,mlflow,wandb]", "trainer.eval_every=2"]
    straight = ember_train_signalled(["--output", str(tmp_path / "uninterrupted"), *args], env=env)
    assert straight[0] == 0, straight[2][-3000:]
    run_dir = tmp_path / "stopped"
    stopped = ember_train_signalled(["--output", str(run_dir), *args], signal.SIGTERM, "epoch   2 ", env=env)
    assert stopped[0] == 143, stopped[2][-3000:]
    done = ember_train_signalled(["--output", str(run_dir), *args], env=env)
    assert done[0] == 0, done[2][-3000:]

    params, tags = mlflow_params(tracking)
    assert params["stopped"] == {**params["uninterrupted"], "output": str(run_dir)}
    assert [t for t in tags["stopped"] if t.startswith("ember.")] == []  # no setting changed between launches
    runs = {name: (status, metrics) for name, status, metrics, _ in mlflow_runs(tracking)}
    assert runs["stopped"] == runs["uninterrupted"]
    (config, summary), (expected_config, expected_summary) = map(
        config_and_summary, (run_dir, tmp_path / "uninterrupted")
    )
    assert config == {**expected_config, "output": str(run_dir)}
    final = sorted(k for k in summary if not k.startswith("_"))
    assert final == ["train/loss", "train/lr", "val/accuracy", "val/loss"]
    assert {k: summary[k] for k in final} == {k: expected_summary[k] for k in final}
    hparams = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "hparams" in line]
    assert [h["metrics"]["val/accuracy"] for h in hparams] == [summary["val/accuracy"]]


def mlflow_params(tracking):
    """``({run name: params}, {run name: tags})`` of the ``ember`` experiment's runs."""
    from mlflow.tracking import MlflowClient

    with _sqlalchemy_quiet():
        client = MlflowClient(tracking_uri=tracking["MLFLOW_TRACKING_URI"])
        runs = client.search_runs([client.get_experiment_by_name("ember").experiment_id])
        return {r.info.run_name: r.data.params for r in runs}, {r.info.run_name: r.data.tags for r in runs}


def test_a_run_that_raises_is_failed_in_mlflow_with_its_records_kept(tmp_path, tracking, monkeypatch):
    from ember.cli import _run_parts, train

    built = _run_parts.build_data

    def failing_data(config):
        data, val, sample = built(config)

        class Broken:  # the training data's reader fails in the second epoch
            arrays = data.arrays

            def __len__(self):
                return len(data)

            def __iter__(self):
                for i, batch in enumerate(data):
                    if i == 7 and self.epochs == 1:
                        raise OSError("the data's disk went away")
                    yield batch
                self.epochs += 1

            epochs = 0

        return Broken(), val, sample

    monkeypatch.setattr(_run_parts, "build_data", failing_data)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking["MLFLOW_TRACKING_URI"])
    config = {
        "name": "failing",
        "model": {"name": "mlp"},
        "trainer": {"max_epochs": 2},
        "handlers": {"writers": ["jsonl", "mlflow"], "progress": False, "log_every": 5},
        "output": str(tmp_path / "run"),
    }
    with _sqlalchemy_quiet(), pytest.raises(OSError, match="the data's disk went away"):
        train(config, stream=io.StringIO())
    ((name, status, metrics, artifacts),) = mlflow_runs(tracking, "failing")
    assert (name, status, artifacts) == ("run", "FAILED", ["config.yaml"])  # no summary: the run never ended
    assert [s for s, _ in metrics["train/loss"]] == [5, 10, 15, 20, 25]  # every record up to the failure


def sigkill_once_wandb_holds(run_dir, env, step):
    """``ember train`` into ``run_dir``, SIGKILLed once W&B's own process has written a history row past ``step``.

    The file is polled (bounded: 180 s); the run is long enough (40 epochs) not to end first. Returns its status.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "ember.cli", "train", "--output", str(run_dir), *WANDB_RUN],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": PYTHONPATH, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            if any(s > step for _, s, _ in history(run_dir)):
                break
            time.sleep(0.05)
    finally:  # killed and reaped whatever happens here: no process outlives the test
        proc.kill()
        status = proc.wait(timeout=60)
    return status


WANDB_RUN = [*RUN, "trainer.max_epochs=40", "handlers.writers=[wandb]"]


def test_a_killed_and_relaunched_run_is_one_wandb_run_continuing_at_the_resumed_step(tmp_path):
    """Offline W&B: one run id across launches, one history: each step's first row is the uninterrupted run's."""
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB__TRANSACTION_LOG_FLUSH_INTERVAL": "0.2"}
    assert sigkill_once_wandb_holds(tmp_path / "run", env, step=100) == -signal.SIGKILL
    killed = {step for _, step, _ in history(tmp_path / "run")}
    relaunched = ember_train_signalled(["--output", str(tmp_path / "run"), *WANDB_RUN], env=env)
    straight = ember_train_signalled(["--output", str(tmp_path / "straight"), *WANDB_RUN], env=env)
    assert (relaunched[0], straight[0]) == (0, 0), relaunched[2][-3000:]
    resumed = int(re.search(r"\(iteration (\d+)\)", relaunched[1]).group(1))

    run_id = json.loads((tmp_path / "run" / "run.json").read_text())["id"]
    rows = history(tmp_path / "run")
    assert {r for r, _, _ in rows} == {run_id}  # `wandb sync` makes the two launches one run
    assert len(list((tmp_path / "run").rglob("offline-run-*"))) == 2
    first: dict[int, dict] = {}
    for _, step, values in rows:  # W&B keeps a step's first row: a later one for the same step is dropped
        assert first.setdefault(step, values) == values  # and ember's resume is exact: the rows are equal anyway
    expected = {step: values for _, step, values in history(tmp_path / "straight")}
    assert {s: expected[s] for s in first} == first
    # every step but those W&B had not written when the launch was killed (its flush interval, before the checkpoint)
    missing = sorted(set(expected) - set(first))
    assert all(max(killed) < s <= resumed for s in missing), (max(killed), resumed, missing)
    assert exit_codes(tmp_path / "run") == [0]  # the killed launch never finished; the relaunch did
    (record,) = [r.run for r in read_records(next((tmp_path / "run").rglob("run-*.wandb"))) if r.HasField("run")]
    assert (record.project, record.display_name) == ("ember", "run")


def test_a_watcher_writes_into_the_run_s_own_writers_and_mlflow_run_each_step_once_through_a_relaunch(
    tmp_path, tracking, monkeypatch
):
    """``ember eval --watch`` records with the run's writers: files under eval/NAME, metrics in the run's MLflow run.

    The MLflow run's status and end stay the training job's; a relaunch after a kill between the records and
    watch.json writes each step once in every writer.
    """
    from ember.cli import main, train
    from tests.writers.tb_reader import tensorboard_scalars

    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking["MLFLOW_TRACKING_URI"])
    run = tmp_path / "run"
    config = {
        "name": "watched",
        "model": {"name": "mlp"},
        "trainer": {"max_epochs": 1},
        "handlers": {
            "writers": ["console", "jsonl", "csv", "tensorboard", "mlflow"],
            "progress": False,
            "early_stopping": None,
            "log_every": 100,
            "checkpoint": {"every_iters": 10, "keep_latest": 10},
        },
        "output": str(run),
    }
    watch = ["eval", str(run), "--watch", "--name", "w", "--poll", "0.2"]
    with _sqlalchemy_quiet():
        train(config, stream=io.StringIO())
        ended = _end_time(tracking, run)
        assert main(watch) == 0
        (run / "eval" / "w" / "watch.json").write_text(json.dumps({"evaluated": [10], "missed": []}))
        assert main(watch) == 0  # killed after 20's and 22's records, before watch.json said so: both again
    rows = [json.loads(line) for line in (run / "eval" / "w" / "metrics.jsonl").read_text().splitlines()]
    expected = [(r["step"], r["w/val/accuracy"]) for r in rows]
    assert [s for s, _ in expected] == [10, 20, 22]
    ((name, status, metrics, _),) = mlflow_runs(tracking, "watched")
    assert (name, status) == ("run", "FINISHED")  # the training job's, untouched by the watcher
    with _sqlalchemy_quiet():
        assert _end_time(tracking, run) == ended  # never ended again by the watcher
    assert metrics["w/val/accuracy"] == expected
    assert metrics["w/val/accuracy"][-1][1] == metrics["val/accuracy"][-1][1]  # step 22: the run's own evaluation
    assert [s for s, _ in metrics["w/val/loss"]] == [10, 20, 22]
    csv_rows = (run / "eval" / "w" / "metrics.csv").read_text().splitlines()
    assert csv_rows[0] == "step,name,value"
    accuracy = [(int(s), float(v)) for s, n, v in (r.split(",") for r in csv_rows[1:]) if n == "w/val/accuracy"]
    assert accuracy == expected
    shown = tensorboard_scalars(run / "eval" / "w" / "tb")["w/val/accuracy"]
    assert shown == [(s, round(float(np.float32(a)), 6)) for s, a in expected]
    files = sorted(p.name for p in (run / "eval" / "w").iterdir())
    assert files == ["metrics.csv", "metrics.jsonl", "tb", "watch.json"]


def _end_time(tracking, run):
    from mlflow.tracking import MlflowClient

    run_id = json.loads((run / "run.json").read_text())["trackers"]["mlflow"]
    return MlflowClient(tracking_uri=tracking["MLFLOW_TRACKING_URI"]).get_run(run_id).info.end_time
