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


def test_ember_train_logs_to_mlflow_when_the_config_names_it(store, tmp_path, monkeypatch):
    """handlers.writers: [jsonl, mlflow]: the config as params, the metrics by step, the run folder's files."""
    from ember.cli import train

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    run_dir = tmp_path / "digits-run"
    config = {
        "model": {"name": "mlp"},
        "trainer": {"max_epochs": 1},
        "handlers": {"writers": ["jsonl", "mlflow"], "progress": False, "log_every": 5},
        "output": str(run_dir),
    }
    train(config)
    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("digits-run")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.params["model.name"] == "mlp"
    assert run.data.params["handlers.writers"] == "['jsonl', 'mlflow']"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [5, 10, 15, 20]
    assert "val/accuracy" in run.data.metrics
    assert {"config.yaml", "metrics.jsonl"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
