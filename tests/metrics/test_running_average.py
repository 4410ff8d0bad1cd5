import jax
import jax.numpy as jnp
import pytest

from ember import Engine, Events
from ember.metrics import Accuracy, RunningAverage


def test_running_average_of_an_output_reproduces_ignites_values():
    """Outputs 0, 1, 0, 1, 0, 1 with alpha=0.98 give Ignite's 0.0, 0.02, 0.0196, 0.039208, 0.03842384, 0.0576553632."""
    engine = Engine(lambda e, batch: {"loss": jnp.asarray(batch, jnp.float32)})
    RunningAverage(output_transform=lambda out: out["loss"], alpha=0.98).attach(engine, "loss")
    seen = []
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(float(e.state.metrics["loss"])))
    engine.run([0, 1, 0, 1, 0, 1])
    assert seen == pytest.approx([0.0, 0.02, 0.0196, 0.039208, 0.03842384, 0.0576553632], abs=1e-7)


def test_running_average_keeps_a_device_value_in_state_metrics():
    """The published value is a device scalar; nothing is read back until a handler converts it."""
    engine = Engine(lambda e, batch: {"loss": jnp.asarray(batch, jnp.float32)})
    RunningAverage(output_transform=lambda out: out["loss"]).attach(engine, "loss")
    state = engine.run([1.0, 3.0])
    assert isinstance(state.metrics["loss"], jax.Array)
    assert float(state.metrics["loss"]) == pytest.approx(0.98 + 0.02 * 3.0)


def test_running_average_over_a_metric_uses_its_batch_value():
    """Over Accuracy, each update averages that batch's accuracy; it restarts with each run."""
    engine = Engine(lambda e, batch: batch)
    RunningAverage(Accuracy(), alpha=0.5).attach(engine, "acc")
    right = {"y_pred": jnp.array([[1.0, 0.0]]), "y": jnp.array([0])}
    wrong = {"y_pred": jnp.array([[1.0, 0.0]]), "y": jnp.array([1])}
    assert float(engine.run([right, wrong, wrong]).metrics["acc"]) == 0.25
    assert float(engine.run([wrong]).metrics["acc"]) == 0.0


def test_running_average_arguments_are_checked():
    """Exactly one source, and alpha strictly between 0 and 1."""
    with pytest.raises(ValueError, match=r"exactly one of `src` \(a metric\) and `output_transform`"):
        RunningAverage()
    with pytest.raises(ValueError, match=r"`alpha` must be a number in \(0, 1\), got 1.0"):
        RunningAverage(output_transform=lambda o: o, alpha=1.0)
    with pytest.raises(TypeError, match=r"`src` must be a Metric, got int"):
        RunningAverage(3)  # type: ignore[arg-type]


def test_merged_over_processes_the_running_average_is_the_mean_of_those_that_started():
    """Parts saved by three processes, one of which never updated: the mean of the two, not of three."""
    parts = [
        (jnp.float32(4.0), jnp.float32(1.0)),
        (jnp.float32(0.0), jnp.float32(0.0)),
        (jnp.float32(2.0), jnp.float32(1)),
    ]
    average, started = RunningAverage(output_transform=float).merge_processes(parts)
    assert (float(average), float(started)) == (3.0, 1.0)
