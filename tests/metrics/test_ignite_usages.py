"""Ignite's usage classes and RunningAverage's usages, run as Ignite's documentation runs them (v0.5.5)."""

import jax
import jax.numpy as jnp
import pytest

from ember import Engine, Events
from ember.metrics import (
    Accuracy,
    Average,
    BatchFiltered,
    BatchWise,
    EpochWise,
    MetricUsage,
    RunningAverage,
    RunningBatchWise,
    RunningEpochWise,
    SingleEpochRunningBatchWise,
)

# Ignite's RunningAverage example: predictions and targets over six iterations.
Y_PRED = [[0], [0], [0], [1], [1], [1]]
Y_TRUE = [[0], [1], [0], [1], [0], [1]]


def _pairs():
    return [(jnp.array(p), jnp.array(t)) for p, t in zip(Y_PRED, Y_TRUE, strict=True)]


@pytest.mark.parametrize(
    ("usage", "events"),
    [
        (EpochWise(), ("EPOCH_STARTED", "ITERATION_COMPLETED", "EPOCH_COMPLETED")),
        (BatchWise(), ("ITERATION_STARTED", "ITERATION_COMPLETED", "ITERATION_COMPLETED")),
        (RunningEpochWise(), ("STARTED", "EPOCH_COMPLETED", "EPOCH_COMPLETED")),
        (RunningBatchWise(), ("STARTED", "ITERATION_COMPLETED", "ITERATION_COMPLETED")),
        (SingleEpochRunningBatchWise(), ("EPOCH_STARTED", "ITERATION_COMPLETED", "ITERATION_COMPLETED")),
    ],
)
def test_ignites_usage_classes_name_ignites_events(usage, events):
    """Each class has Ignite's STARTED / ITERATION_COMPLETED / COMPLETED and usage_name, and attach takes it."""
    assert (usage.STARTED.name, usage.ITERATION_COMPLETED.name, usage.COMPLETED.name) == events
    assert isinstance(usage, MetricUsage)
    assert usage == type(usage)()
    Average().attach(Engine(lambda e, b: b), "value", usage=usage)
    Average().attach(Engine(lambda e, b: b), "value", usage=type(usage).usage_name)


def test_batch_filtered_updates_where_its_filter_fires():
    engine = Engine(lambda e, b: jnp.asarray(b, jnp.float32))
    Average().attach(engine, "avg", usage=BatchFiltered(every=2))
    assert engine.run([1.0, 2.0, 3.0, 4.0]).metrics["avg"] == 3.0
    assert isinstance(MetricUsage.filtered(Events.ITERATION_COMPLETED(every=2)), BatchFiltered)


def test_running_average_of_a_metric_batch_wise_gives_ignites_documented_values():
    """Ignite's RunningAverage(Accuracy()) example prints 1.0, 0.98, 0.98039..., 0.98079..., 0.96117..., 0.96195..."""
    engine = Engine(lambda e, b: b)
    RunningAverage(Accuracy()).attach(engine, "running_avg_accuracy")
    seen = []
    engine.add_event_handler(
        Events.ITERATION_COMPLETED, lambda e: seen.append(float(e.state.metrics["running_avg_accuracy"]))
    )
    engine.run(_pairs())
    # 0.98 * previous + 0.02 * this batch's accuracy, from 1.0: the digits Ignite's documentation prints
    assert seen == pytest.approx([1.0, 0.98, 0.9804, 0.980792, 0.96117616, 0.9619526368], abs=1e-6)


def test_running_average_over_epochs_averages_each_epochs_value():
    """With RunningEpochWise the metric accumulates over an epoch; its epoch value joins the average at its end."""
    engine = Engine(lambda e, b: b)
    avg = RunningAverage(Accuracy(), alpha=0.5)
    avg.attach(engine, "acc", usage=RunningEpochWise())
    seen = []
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: seen.append(float(e.state.metrics["acc"])))
    pairs = _pairs()
    engine.run(pairs[:3] + pairs[3:], max_epochs=2, epoch_length=3)  # epochs of 3: accuracies 2/3, then 2/3
    assert seen == pytest.approx([2 / 3, 2 / 3])
    engine = Engine(lambda e, b: b)
    avg = RunningAverage(Accuracy(), alpha=0.5)
    avg.attach(engine, "acc", usage="running_epoch_wise")
    seen = []
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: seen.append(float(e.state.metrics["acc"])))
    perfect = [(jnp.array([1]), jnp.array([1]))] * 2
    wrong = [(jnp.array([0]), jnp.array([1]))] * 2
    engine.run(perfect + wrong, max_epochs=2, epoch_length=2)  # epoch accuracies 1.0 then 0.0
    assert seen == pytest.approx([1.0, 0.5])
    avg.detach(engine)
    assert not avg.src.is_attached(engine)


def test_running_average_of_an_output_over_epochs_takes_each_epochs_last_output():
    engine = Engine(lambda e, b: jnp.float32(b))
    RunningAverage(output_transform=lambda out: out, alpha=0.5).attach(engine, "avg", usage=RunningEpochWise())
    assert float(engine.run([1.0, 2.0, 3.0, 4.0], max_epochs=2, epoch_length=2).metrics["avg"]) == 3.0  # 2, then 4


@pytest.mark.parametrize(
    ("epoch_bound", "expected"), [(True, [0.0, 0.02, 0.0, 0.02]), (False, [0.0, 0.02, 0.0196, 0.039208])]
)
def test_epoch_bound_warns_as_ignite_and_picks_the_usage(epoch_bound, expected):
    """Ignite: epoch_bound=True is SingleEpochRunningBatchWise (restarts each epoch), False is RunningBatchWise."""
    with pytest.warns(UserWarning, match=r"^`epoch_bound` is deprecated and will be removed in the future"):
        avg = RunningAverage(output_transform=lambda out: out, epoch_bound=epoch_bound)
    engine = Engine(lambda e, b: jnp.float32(b))
    avg.attach(engine, "avg", usage=RunningEpochWise())  # epoch_bound wins, as in Ignite
    seen = []
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(float(e.state.metrics["avg"])))
    engine.run([0.0, 1.0], max_epochs=2)
    assert seen == pytest.approx(expected, abs=1e-6)
    jax.block_until_ready(avg.state)
