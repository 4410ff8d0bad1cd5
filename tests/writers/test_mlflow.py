import re

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from ember import Events
from ember.cli import Config
from ember.handlers import ScalarLogger
from ember.training import TrainState, create_trainer
from ember.writers import MlflowWriter


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its folder store in maintenance mode
    return f"file://{tmp_path / 'mlruns'}"


def test_a_run_logs_params_metrics_with_steps_and_the_run_folder_read_back_by_mlflow(store, tmp_path):
    import jax.numpy as jnp
    import optax

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text('{"best": 0.9}')
    writer = MlflowWriter(store, experiment="digits", run_name="first", params=Config(), artifacts=run_dir)
    state = TrainState.create(lambda p, x: x * p, jnp.array(1.0), optax.sgd(0.1))
    trainer = create_trainer(state, lambda model, x: jnp.mean(model(x) ** 2))
    ScalarLogger(writer, tag="train", output_keys=["loss"]).attach(trainer, Events.ITERATION_COMPLETED(every=2))
    trainer.run([jnp.ones(2)] * 6)
    writer.write_text(6, "notes", "converged")
    writer.close()

    client = MlflowClient(tracking_uri=store)
    run = client.get_run(writer.run_id)
    assert (run.info.run_name, run.info.status) == ("first", "FINISHED")
    assert run.data.params["optimizer.learning_rate"] == str(Config().optimizer.learning_rate)
    assert run.data.params["trainer.max_epochs"] == "15"
    history = client.get_metric_history(writer.run_id, "train/loss")
    assert [m.step for m in history] == [2, 4, 6]
    expected = [0.64 ** (i - 1) for i in (2, 4, 6)]  # p <- 0.8 p each step; step i's loss is p_{i-1}^2
    np.testing.assert_allclose([m.value for m in history], expected, rtol=1e-5)
    assert sorted(a.path for a in client.list_artifacts(writer.run_id)) == ["notes", "summary.json"]
    assert client.get_experiment(run.info.experiment_id).name == "digits"


def test_params_must_be_a_mapping_or_a_dataclass(store):
    with pytest.raises(TypeError, match=re.escape("`params` must be a mapping or a dataclass instance, got list.")):
        MlflowWriter(store, params=[1, 2])


def test_a_run_ends_finished_failed_or_killed_as_its_writer_is_told(store):
    statuses = []
    for outcome in (None, "finished", "failed", "killed"):
        writer = MlflowWriter(store)
        if outcome is not None:
            writer.set_outcome(outcome)
        writer.close()
        statuses.append(writer.client.get_run(writer.run_id).info.status)
    assert statuses == ["FINISHED", "FINISHED", "FAILED", "KILLED"]
    with pytest.raises(ValueError, match=re.escape("`outcome` must be one of ['finished', 'failed', 'killed'], got")):
        MlflowWriter(store).set_outcome("crashed")


def test_a_with_block_left_by_an_exception_ends_the_run_failed_and_by_ctrl_c_killed(store):
    from ember.writers import AsyncWriter

    run_ids = []

    def log_then_raise(error):
        with AsyncWriter(MlflowWriter(store)) as writer:
            run_ids.append(writer.writer.run_id)
            writer.write_scalars(1, {"loss": 0.5})
            raise error

    for error in (RuntimeError("data gone"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            log_then_raise(error)
    client = MlflowClient(tracking_uri=store)
    assert [client.get_run(r).info.status for r in run_ids] == ["FAILED", "KILLED"]
    assert [client.get_run(r).data.metrics for r in run_ids] == [{"loss": 0.5}, {"loss": 0.5}]  # nothing lost


def test_a_relaunch_continues_the_run_by_id_each_step_logged_once(store):
    first = MlflowWriter(store, run_name="digits", params={"lr": 0.1, "placement": "single"})
    for step in (5, 10, 15, 20):  # the launch is killed after step 20; its last checkpoint was step 10
        first.write_scalars(step, {"loss": 1 / step})
    again = MlflowWriter(store, params={"lr": 0.1, "placement": "fsdp", "seed": 0}, run_id=first.run_id)
    client = MlflowClient(tracking_uri=store)
    assert client.get_run(first.run_id).info.status == "RUNNING"
    again.resume_at(10)
    for step in (15, 20, 25):
        again.write_scalars(step, {"loss": 1 / step, "lr": 0.1})
    again.close()
    run = client.get_run(first.run_id)
    assert (run.info.run_name, run.info.status) == ("digits", "FINISHED")
    assert [(m.step, m.value) for m in client.get_metric_history(first.run_id, "loss")] == [
        (s, 1 / s) for s in (5, 10, 15, 20, 25)
    ]
    assert [m.step for m in client.get_metric_history(first.run_id, "lr")] == [15, 20, 25]  # new: none to skip
    assert run.data.params == {"lr": "0.1", "placement": "single", "seed": "0"}  # the first value stands
    assert run.data.tags["ember.relaunch.placement"] == "fsdp"  # and the relaunch's is recorded
    with pytest.raises(LookupError, match=re.escape("`run_id` 'f00' names no run in the tracking store file://")):
        MlflowWriter(store, run_id="f00")
