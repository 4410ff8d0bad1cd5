import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ember.metrics._metric as metric_module
from ember import Engine, Events
from ember.metrics import (
    BATCH_WISE,
    RUNNING_BATCH_WISE,
    RUNNING_EPOCH_WISE,
    SINGLE_EPOCH_RUNNING_BATCH_WISE,
    Accuracy,
    Average,
    Collect,
    MetricUsage,
    RocAuc,
    RunningAverage,
)
from ember.training import TrainState, create_trainer

# Two epochs of two batches: values 1..8, two per batch.
DATA = [jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])]


def engine_recording(metric, usage, event=Events.ITERATION_COMPLETED):
    """An engine echoing its batch, with ``metric`` attached as "avg" and its value recorded at ``event``."""
    engine = Engine(lambda e, batch: batch + 4.0 * (e.state.epoch - 1))
    metric.attach(engine, "avg", usage=usage)
    seen = []
    engine.add_event_handler(event, lambda e: seen.append(float(e.state.metrics["avg"])))
    return engine, seen


def test_epoch_wise_resets_each_epoch_and_computes_at_epoch_end():
    """The default usage gives each epoch's mean at EPOCH_COMPLETED."""
    engine, seen = engine_recording(Average(), "epoch_wise", Events.EPOCH_COMPLETED)
    engine.run(DATA, max_epochs=2)
    assert seen == [2.5, 6.5]


def test_batch_wise_gives_each_batch_value():
    """batch_wise resets per iteration and computes at ITERATION_COMPLETED."""
    engine, seen = engine_recording(Average(), BATCH_WISE)
    engine.run(DATA, max_epochs=2)
    assert seen == [1.5, 3.5, 5.5, 7.5]


def test_running_epoch_wise_updates_at_each_epochs_end_as_ignite():
    """Ignite's running_epoch_wise: reset once at STARTED, update and compute at EPOCH_COMPLETED (the last output)."""
    engine, seen = engine_recording(Average(), RUNNING_EPOCH_WISE, Events.EPOCH_COMPLETED)
    engine.run(DATA, max_epochs=2)
    assert seen == [3.5, 5.5]  # [3, 4], then [3, 4, 7, 8]


def test_running_batch_wise_gives_the_run_so_far_every_iteration():
    """running_batch_wise resets once at STARTED and computes every iteration."""
    engine, seen = engine_recording(Average(), "running_batch_wise")
    engine.run(DATA, max_epochs=2)
    assert seen == [1.5, 2.5, 3.5, 4.5]
    assert RUNNING_BATCH_WISE.name == "running_batch_wise"


def test_single_epoch_running_batch_wise_gives_the_epoch_so_far_every_iteration():
    """single_epoch_running_batch_wise resets at EPOCH_STARTED and computes every iteration."""
    engine, seen = engine_recording(Average(), SINGLE_EPOCH_RUNNING_BATCH_WISE)
    engine.run(DATA, max_epochs=2)
    assert seen == [1.5, 2.5, 5.5, 6.5]


def test_usage_names_before_ignites_are_gone():
    """Usage names of ember before Ignite's were never released: Ignite's are accepted, the error lists them."""
    with pytest.raises(ValueError, match=re.escape("`usage` must be one of ['batch_wise', 'epoch_wise', 'running_")):
        engine_recording(Average(), "running", Events.EPOCH_COMPLETED)
    with pytest.raises(ImportError, match="SINGLE_EPOCH_RUNNING"):
        from ember.metrics import SINGLE_EPOCH_RUNNING  # type: ignore[attr-defined]  # noqa: F401


def test_filtered_usage_updates_only_where_the_filter_fires():
    """A filtered usage skips the iterations its filter does not select."""
    usage = MetricUsage.filtered(Events.ITERATION_COMPLETED(every=2))
    engine, seen = engine_recording(Average(), usage, Events.EPOCH_COMPLETED)
    engine.run(DATA, max_epochs=2)
    assert seen == [3.5, 7.5]
    with pytest.raises(ValueError, match=r"A filtered usage takes Events.ITERATION_COMPLETED\(...\) with a filter"):
        MetricUsage.filtered(Events.EPOCH_COMPLETED)  # type: ignore[arg-type]


def test_a_metric_under_two_names_updates_once():
    """Attached as "a" and "b", the metric is updated once per iteration and both names get its value."""
    metric = Average()
    engine = Engine(lambda e, batch: batch)
    updates = []
    original = metric.update
    metric.update = lambda out: (updates.append(1), original(out))  # type: ignore[method-assign]
    metric.attach(engine, "a")
    metric.attach(engine, "b")
    state = engine.run(DATA)
    assert state.metrics == {"a": 2.5, "b": 2.5}
    assert len(updates) == 2
    with pytest.raises(
        ValueError, match=r"attached to the engine with usage 'epoch_wise'; one metric object has one usage"
    ):
        metric.attach(engine, "c", usage="batch_wise")


def test_metric_handlers_run_before_a_logger_attached_earlier():
    """A logger registered before the metric still sees the metric's fresh value (Ignite #706)."""
    engine = Engine(lambda e, batch: batch)
    seen = []
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: seen.append(e.state.metrics.get("avg")))
    Average().attach(engine, "avg")
    engine.run(DATA, max_epochs=2)
    assert seen == [2.5, 2.5]


def test_detach_and_is_attached():
    """Detaching removes the handlers and the name; a partial detach keeps the other name."""
    metric = Average()
    engine = Engine(lambda e, batch: batch)
    metric.attach(engine, "a")
    metric.attach(engine, "b")
    metric.detach(engine, "a")
    assert metric.is_attached(engine)
    assert not metric.is_attached(engine, "a")
    assert engine.run(DATA).metrics == {"b": 2.5}
    metric.detach(engine)
    assert not metric.is_attached(engine)
    engine.state.max_epochs = None
    assert engine.run(DATA).metrics == {}


def test_errors_name_the_problem():
    """Missing keys, computing before an update, bad usage and bad arguments raise clear errors."""
    with pytest.raises(
        KeyError, match=r"Accuracy needs the keys \['y_pred', 'y'\] in the output, but \['y'\] is missing"
    ):
        Accuracy().update({"y_pred": jnp.ones((2, 3)), "loss": 0.1})
    with pytest.raises(RuntimeError, match=r"Metric `Accuracy` was computed before any update; attach it"):
        Accuracy().compute()
    with pytest.raises(ValueError, match=r"`usage` must be one of \['batch_wise', 'epoch_wise'"):
        Average().attach(Engine(lambda e, b: b), "x", usage="per_epoch")
    with pytest.raises(KeyError, match=r"Average got a mapping output with keys \['loss'\]; say which value"):
        Average().update({"loss": jnp.array(1.0)})
    with pytest.raises(TypeError, match=r"`engine` must be an ember Engine, got str"):
        Average().attach("trainer", "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`output_transform` must be callable"):
        Average(output_transform=3)  # type: ignore[arg-type]


def test_output_transform_picks_and_renames():
    """output_transform maps an output that lacks the metric's keys."""
    acc = Accuracy(output_transform=lambda out: (out["logits"], out["labels"]))
    acc.update({"logits": jnp.array([[1.0, 0.0], [0.0, 1.0]]), "labels": jnp.array([0, 0])})
    assert acc.compute() == 0.5
    as_ignite = Accuracy(output_transform=lambda out: [out["logits"], out["labels"]])  # a list, as Ignite's docs
    as_ignite.update({"logits": jnp.array([[1.0, 0.0], [0.0, 1.0]]), "labels": jnp.array([1, 1])})
    assert as_ignite.compute() == 0.5


def test_merged_updates_equal_one_update_and_jit_equals_eager():
    """Per-batch updates merged equal one update on the concatenated batch; the jitted merge equals eager."""
    rng = np.random.default_rng(1)
    scores, y = rng.normal(size=(30, 3)).astype(np.float32), rng.integers(0, 3, 30)
    merged, whole = Accuracy(), Accuracy()
    for i in range(0, 30, 4):
        merged.update((jnp.asarray(scores[i : i + 4]), jnp.asarray(y[i : i + 4])))
    whole.update((jnp.asarray(scores), jnp.asarray(y)))
    assert merged.compute() == whole.compute()
    metric = Accuracy()
    eager = metric.merge(metric.empty(), metric.batch_state(jnp.asarray(scores), jnp.asarray(y)))
    jitted = jax.jit(lambda s: metric.merge(s, metric.batch_state(jnp.asarray(scores), jnp.asarray(y))))(metric.empty())
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(jitted))


def test_an_epoch_wise_metric_reads_nothing_before_epoch_completed(monkeypatch):
    """An epoch-wise metric's only host read is at EPOCH_COMPLETED, under a transfer guard held all epoch.

    The guard is on from EPOCH_STARTED until just before the metric computes; on CPU it is silent (jax
    #16602), so the metric's one host-read function is also spied on.
    """
    engine = Engine(lambda e, batch: {"y_pred": batch[0], "y": batch[1]})
    guard = jax.transfer_guard_device_to_host("disallow")

    def enter() -> None:
        guard.__enter__()

    def leave() -> None:
        guard.__exit__(None, None, None)

    engine.add_priority_handler(Events.EPOCH_STARTED, enter)
    engine.add_priority_handler(Events.EPOCH_COMPLETED, leave)  # registered first: runs before the metric computes
    Accuracy().attach(engine, "accuracy")
    reads = []
    to_host = metric_module._to_host
    monkeypatch.setattr(metric_module, "_to_host", lambda v: (reads.append(engine.last_event_name), to_host(v))[1])
    data = [(jnp.eye(3)[jnp.array([0, 1, 2])], jnp.array([0, 1, 1]))] * 4
    state = engine.run(data, max_epochs=2)
    assert state.metrics["accuracy"] == pytest.approx(2 / 3)
    assert reads == [Events.EPOCH_COMPLETED, Events.EPOCH_COMPLETED]


def _loss_trainer():
    state = TrainState.create(lambda p, x: x * p, jnp.array(0.5), optax.sgd(0.1))
    trainer = create_trainer(state, lambda m, b: jnp.mean((m(b) - 1.0) ** 2))
    RunningAverage(output_transform=lambda out: out["loss"]).attach(trainer, "running")
    Average(output_transform=lambda out: out["loss"]).attach(trainer, "epoch_loss")
    seen: list[tuple[int, float, float]] = []
    trainer.add_event_handler(
        Events.ITERATION_COMPLETED,
        lambda e: seen.append(
            (e.state.iteration, float(e.state.metrics["running"]), e.state.metrics.get("epoch_loss", -1.0))
        ),
    )
    return trainer, seen


LOSS_DATA = [jnp.full(2, v) for v in (1.0, 2.0, 3.0, 0.5)]


@pytest.mark.parametrize("stop_at", [2, 4, 6])
def test_metrics_resume_exactly_from_an_engine_state_dict(stop_at):
    """Running and epoch-wise averages, and the values in state.metrics, continue as if never stopped."""
    straight, expected = _loss_trainer()
    straight.run(LOSS_DATA, max_epochs=2)
    first, _ = _loss_trainer()
    saved: list[tuple[dict, dict]] = []
    first.add_event_handler(
        Events.ITERATION_COMPLETED(once=stop_at),
        lambda e: (saved.append((e.state_dict(), e.tree_state_dict())), e.terminate()),
    )
    first.run(LOSS_DATA, max_epochs=2)
    resumed, seen = _loss_trainer()
    resumed.load_state_dict(saved[0][0])
    resumed.load_tree_state_dict(saved[0][1])
    resumed.run(LOSS_DATA, max_epochs=2)
    assert seen == expected[stop_at:]  # 4: the epoch's last iteration, resumed at its EPOCH_COMPLETED
    assert resumed.state.metrics == {
        "running": straight.state.metrics["running"],
        "epoch_loss": straight.state.metrics["epoch_loss"],
    }


def _collecting_engine():
    engine = Engine(lambda e, batch: batch)
    RocAuc().attach(engine, "auc")
    Collect(output_transform=lambda out: (out[0],)).attach(engine, "scores")
    return engine


SCORED = [
    (jnp.array([0.1, 0.9, 0.4]), jnp.array([0, 1, 1])),
    (jnp.array([0.8, 0.3, 0.35]), jnp.array([1, 0, 0])),
    (jnp.array([0.2, 0.7, 0.6]), jnp.array([0, 1, 0])),
    (jnp.array([0.5, 0.05, 0.95]), jnp.array([1, 0, 1])),
]


def test_collected_batches_survive_a_mid_epoch_resume():
    """Collect and RocAuc keep the batches seen before a checkpoint: the resumed epoch computes the whole epoch.

    They saved only an update count before (the inherited state_dict), so a resumed epoch computed from its last
    batches alone.
    """
    straight = _collecting_engine()
    straight.run(SCORED, max_epochs=1)
    first = _collecting_engine()
    saved = []
    first.add_event_handler(
        Events.ITERATION_COMPLETED(once=2), lambda e: (saved.append(json.dumps(e.state_dict())), e.terminate())
    )
    first.run(SCORED, max_epochs=1)
    resumed = _collecting_engine()
    resumed.load_state_dict(json.loads(saved[0]))
    resumed.run(SCORED, max_epochs=1)
    assert resumed.state.iteration == 4
    assert (
        resumed.state.metrics["auc"] == straight.state.metrics["auc"] == pytest.approx(34 / 36)
    )  # scikit-learn: 0.9444
    assert [a.tolist() for a in resumed.state.metrics["scores"]] == [
        a.tolist() for a in straight.state.metrics["scores"]
    ]
    assert len(resumed.state.metrics["scores"][0]) == 12


def test_a_metric_state_round_trips_exactly():
    """state_dict() / load_state_dict() keep dtypes and values bit for bit, NaN included."""
    acc, copy = Accuracy(), Accuracy()
    acc.update({"y_pred": jnp.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]), "y": jnp.array([0, 0, 0])})
    copy.load_state_dict(json.loads(json.dumps(acc.state_dict())))
    assert copy.compute() == acc.compute() == np.float32(2 / 3)
    avg, back = Average(), Average()
    avg.update(jnp.array([jnp.nan, 1.0]))
    back.load_state_dict(json.loads(json.dumps(avg.state_dict())))
    assert np.isnan(back.compute())
    assert back.state_dict()["updates"] == 1


def test_a_restored_running_average_survives_the_resumed_runs_started_only():
    """The restored value continues through a resumed run's STARTED; a new run from zero resets it."""
    engine = Engine(lambda e, b: {"loss": jnp.asarray(b, jnp.float32)})
    avg = RunningAverage(output_transform=lambda out: out["loss"], alpha=0.5)
    avg.attach(engine, "loss")
    scalar = {"dtype": "float32", "shape": []}
    saved = {"state": {"tuple": [{**scalar, "data": [4.0]}, {**scalar, "data": [1.0]}]}, "updates": 1}
    engine.load_state_dict({"iteration": 1, "epoch_length": 2, "max_epochs": 1, "attached": {"metric:loss": saved}})
    engine.run([0.0, 2.0])
    assert float(engine.state.metrics["loss"]) == 3.0  # 0.5 * 4 + 0.5 * 2
    engine.state.max_epochs = None
    engine.run([0.0, 2.0])
    assert float(engine.state.metrics["loss"]) == 1.0  # reset at STARTED: 0, then 0.5 * 0 + 0.5 * 2


@pytest.mark.parametrize(
    ("saved", "error", "match"),
    [
        ({"state": None}, ValueError, "`state_dict` of Average must hold 'state' and 'updates', got {'state': None}."),
        ({"state": None, "updates": -1}, ValueError, "`state_dict['updates']` must be a non-negative int, got -1."),
        (
            {"state": {"tuple": [{"dtype": "float32", "shape": [], "data": [1.0]}]}, "updates": 1},
            ValueError,
            "The saved state of Average has the structure PyTreeDef((*,)), this metric PyTreeDef((*, *)); was it "
            "saved by another kind of metric?",
        ),
    ],
)
def test_load_state_dict_refuses_a_state_that_is_not_this_metrics(saved, error, match):
    """Missing keys, a bad count and another metric's structure are refused, saying which."""
    with pytest.raises(error, match=re.escape(match)):
        Average().load_state_dict(saved)


def test_attach_returns_a_handle_that_detaches_that_name():
    """remove() detaches the metric under that name (its value leaves state.metrics); a second remove is a no-op."""
    engine = Engine(lambda e, b: jnp.asarray(b, jnp.float32))
    avg = Average()
    first, second = avg.attach(engine, "a"), avg.attach(engine, "b")
    first.remove()
    assert (avg.is_attached(engine, "a"), avg.is_attached(engine, "b")) == (False, True)
    assert engine.run([[1.0, 3.0]]).metrics == {"b": 2.0}
    second.remove()
    second.remove()
    assert not avg.is_attached(engine)
    assert engine.run([[5.0]]).metrics == {}


def test_state_metrics_holds_host_numbers_once_computed_and_device_scalars_while_published():
    """The documented rule: a computed value is a Python float; a per-step published one a 0-d device array."""
    engine = Engine(lambda e, batch: {"loss": jnp.mean(batch)})
    Average(output_transform=lambda out: out["loss"]).attach(engine, "epoch_loss")
    RunningAverage(output_transform=lambda out: out["loss"]).attach(engine, "running_loss")
    metrics = engine.run(DATA).metrics
    assert type(metrics["epoch_loss"]) is float
    assert isinstance(metrics["running_loss"], jax.Array)
    assert metrics["running_loss"].shape == ()
    formatted = [f"{metrics[name]:.4f}" for name in ("epoch_loss", "running_loss")]
    assert formatted == ["2.5000", "1.5400"]  # the running one: 0.98 * 1.5 + 0.02 * 3.5


def test_a_state_saved_by_two_processes_resumes_merged_in_one():
    """Each process's part saved; resumed on one process they merge: the global value is unchanged."""
    from ember.metrics._saved import encode_tree

    saved = {
        "processes": [
            {"state": encode_tree((np.float32(3.0), np.float32(2.0))), "updates": 1},
            {"state": encode_tree((np.float32(9.0), np.float32(4.0))), "updates": 2},
        ]
    }
    avg = Average()
    avg.load_state_dict(saved)
    assert avg.compute() == 2.0  # (3 + 9) / (2 + 4)
    with pytest.raises(ValueError, match=re.escape("`state_dict['processes']` of Average must be a non-empty list")):
        Average().load_state_dict({"processes": []})
