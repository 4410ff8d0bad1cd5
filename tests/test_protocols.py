"""Every built-in keeps the contract its protocol declares: placements, writers, iterators, state, fused metrics."""

import inspect
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ember.metrics
import ember.writers
from ember import Engine, Stateful, TreeStateful
from ember.data import ArrayDataset, DevicePrefetch, GrainPipeline, Mapped, NpySource, ResumableIterator
from ember.handlers import Checkpoint, EarlyStopping
from ember.metrics import (
    ROC_AUC,
    Accuracy,
    Average,
    Collect,
    ConfusionMatrix,
    EpochMetric,
    Fbeta,
    Frequency,
    FusableMetric,
    FusingEngine,
    Last,
    Loss,
    Max,
    MeanAbsoluteError,
    MeanSquaredError,
    Metric,
    Min,
    Perplexity,
    Precision,
    R2Score,
    Recall,
    RocAuc,
    RootMeanSquaredError,
    RunningAverage,
    Std,
    Sum,
    TopKAccuracy,
    TopKCategoricalAccuracy,
)
from ember.training import DataParallel, Placement, Pmap, SingleDevice, TrainState, create_trainer, fsdp
from ember.writers import Writer

SCORES = {
    "y_pred": jnp.array([[0.1, 0.7, 0.2], [0.8, 0.1, 0.1], [0.2, 0.2, 0.6], [0.3, 0.4, 0.3]]),
    "y": jnp.array([1, 0, 1, 2]),
}
VALUES = {"y_pred": jnp.array([0.5, 1.5, 2.0, 4.0]), "y": jnp.array([1.0, 1.0, 2.5, 3.0])}
METRICS = {  # every built-in metric, with an output it reads
    "Accuracy": (Accuracy, SCORES),
    "TopKAccuracy": (lambda: TopKAccuracy(k=2), SCORES),
    "Precision": (lambda: Precision(num_classes=3), SCORES),
    "Recall": (lambda: Recall(num_classes=3), SCORES),
    "Fbeta": (lambda: Fbeta(1.0, num_classes=3), SCORES),
    "ConfusionMatrix": (lambda: ConfusionMatrix(num_classes=3), SCORES),
    "Perplexity": (lambda: Perplexity(key="loss"), {"loss": jnp.array(1.3)}),
    "Loss": (lambda: Loss(lambda p, y: jnp.mean((p - y) ** 2)), VALUES),
    "MeanAbsoluteError": (MeanAbsoluteError, VALUES),
    "MeanSquaredError": (MeanSquaredError, VALUES),
    "RootMeanSquaredError": (RootMeanSquaredError, VALUES),
    "R2Score": (R2Score, VALUES),
    "Average": (Average, jnp.array([1.0, 2.0, 4.0])),
    "Sum": (Sum, jnp.array([1.0, 2.0, 4.0])),
    "Max": (Max, jnp.array([1.0, 2.0, 4.0])),
    "Min": (Min, jnp.array([1.0, 2.0, 4.0])),
    "Std": (Std, jnp.array([1.0, 2.0, 4.0])),
    "Last": (Last, jnp.array(3.0)),
    "RunningAverage": (lambda: RunningAverage(output_transform=lambda out: out), jnp.array(3.0)),
    "Collect": (Collect, VALUES),
    "RocAuc": (RocAuc, {"y_pred": jnp.array([0.1, 0.8, 0.4, 0.6]), "y": jnp.array([0, 1, 1, 0])}),
    "ROC_AUC": (ROC_AUC, {"y_pred": jnp.array([0.1, 0.8, 0.4, 0.6]), "y": jnp.array([0, 1, 1, 0])}),
    "TopKCategoricalAccuracy": (lambda: TopKCategoricalAccuracy(2), SCORES),
    "Frequency": (Frequency, 4),  # written Ignite's way: update takes the count itself
    "EpochMetric": (lambda: EpochMetric(lambda p, y: float(np.mean(p == y)), check_compute_fn=False), VALUES),
}


def test_the_metric_table_holds_every_built_in_metric():
    found = {name for name, obj in vars(ember.metrics).items() if inspect.isclass(obj) and issubclass(obj, Metric)}
    assert found - {"Metric"} == set(METRICS)


@pytest.mark.parametrize("name", list(METRICS))
def test_a_fusable_metric_updates_inside_a_step_exactly_as_outside(name):
    """FusableMetric: where a metric says it is fusable, the traced update gives what update() gives."""
    make, output = METRICS[name]
    eager, fused = make(), make()
    assert isinstance(fused, FusableMetric)
    eager.update(output)
    eager.update(output)
    if not fused.fusable:
        assert name in {"Collect", "RocAuc", "ROC_AUC", "EpochMetric", "Last", "Frequency"}  # updated by a handler
        return
    step = jax.jit(lambda state, out: (fused.fused_update(state, out),) * 2)
    for _ in range(2):
        state, again = step(fused.state, output)
        fused.set_state(state, fused.published_value(again) if fused.publishes_per_step else None)
    np.testing.assert_array_equal(np.asarray(fused.compute()), np.asarray(eager.compute()))


def _trainer():
    state = TrainState.create(lambda p, x: x * p, jnp.ones(2), optax.sgd(0.1))
    return create_trainer(state, lambda m, x: jnp.sum(m(x) ** 2))


def test_a_training_engine_fuses_and_a_plain_engine_does_not():
    assert isinstance(_trainer(), FusingEngine)
    assert not isinstance(Engine(lambda e, b: b), FusingEngine)


PLACEMENTS = {
    "SingleDevice": SingleDevice,
    "DataParallel": DataParallel,
    "Pmap": Pmap,
    "Sharded (fsdp)": fsdp,
}


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_every_placement_declares_what_it_does(name):
    """Placement: per_device is the pmap way (an axis name to reduce over); takes_host_batches is prepare_batch's."""
    placement = PLACEMENTS[name]()
    assert isinstance(placement, Placement)
    assert placement.per_device is (placement.axis_name is not None)
    batch = {"x": np.ones((len(jax.devices()) * 2, 3), np.float32)}
    if placement.takes_host_batches:  # nothing to check or reshape: the trainer may skip prepare_batch
        assert placement.prepare_batch(batch) is batch
    assert (name, placement.per_device, placement.takes_host_batches) in {
        ("SingleDevice", False, True),
        ("DataParallel", False, False),
        ("Pmap", True, False),
        ("Sharded (fsdp)", False, False),
    }


def test_every_writer_implements_write_scalars():
    """Writer: each built-in writer is one, and records scalars itself (the protocol's default only raises)."""
    writers = [
        obj
        for obj in vars(ember.writers).values()
        if inspect.isclass(obj) and issubclass(obj, Writer) and obj is not Writer
    ]
    assert sorted(w.__name__ for w in writers) == [
        "AsyncWriter",
        "CluWriter",
        "ConsoleWriter",
        "CsvWriter",
        "JsonlWriter",
        "MlflowWriter",
        "MultiWriter",
        "TensorBoardWriter",
        "WandbWriter",
    ]
    assert [w.__name__ for w in writers if w.write_scalars is Writer.write_scalars] == []


def _iterators(tmp_path):
    data = np.arange(24, dtype=np.float32).reshape(12, 2)
    np.save(tmp_path / "x.npy", data)
    return {
        "ArrayDataset": lambda: iter(ArrayDataset(data, batch_size=3)),
        "DevicePrefetch": lambda: iter(DevicePrefetch(ArrayDataset(data, batch_size=3), jax.device_put, size=2)),
        "Mapped": lambda: Mapped(iter(ArrayDataset(data, batch_size=3)), lambda b: b * 2),
        "GrainPipeline": lambda: iter(GrainPipeline(NpySource({"x": tmp_path / "x.npy"}), batch_size=3, shuffle=False)),
    }


@pytest.mark.parametrize("name", ["ArrayDataset", "DevicePrefetch", "Mapped", "GrainPipeline"])
def test_every_data_iterator_resumes_where_its_position_says(tmp_path, name):
    """ResumableIterator: a fresh iterator set to a saved position yields what the saved one yields next."""
    make = _iterators(tmp_path)[name]
    first = make()
    assert isinstance(first, ResumableIterator)
    next(first)
    saved = json.loads(json.dumps(first.get_state()))  # plain data, as a checkpoint's manifest carries it
    expected = [jax.tree.map(np.asarray, next(first)) for _ in range(2)]
    again = make()
    again.set_state(saved)
    got = [jax.tree.map(np.asarray, next(again)) for _ in range(2)]
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    jax.tree.map(np.testing.assert_array_equal, got, expected)
    for it in (first, again):
        if hasattr(it, "close"):
            it.close()


def _stateful():
    trainer = _trainer()
    return {
        "Engine": Engine(lambda e, b: b),
        "trainer": trainer,
        "EarlyStopping": EarlyStopping(2, lambda e: 0.0, trainer),
        **{name: make() for name, (make, _) in METRICS.items()},
    }


@pytest.mark.parametrize("name", list(_stateful()))
def test_every_stateful_built_in_round_trips_its_state_as_json(name):
    """Stateful: state_dict() is plain data that load_state_dict() takes back to the same state."""
    obj = _stateful()[name]
    if name in METRICS:
        obj.update(METRICS[name][1])
    assert isinstance(obj, Stateful)
    saved = json.loads(json.dumps(obj.state_dict()))
    fresh = _stateful()[name]
    fresh.load_state_dict(saved)
    assert json.loads(json.dumps(fresh.state_dict())) == saved


def test_a_trainer_saves_its_arrays_by_path(tmp_path):
    """TreeStateful: a trainer's train state by path, taken back into another trainer's."""
    trainer, other = _trainer(), _trainer()
    trainer.run([jnp.ones(2)], max_epochs=1)
    assert isinstance(trainer, TreeStateful)
    assert not isinstance(Engine(lambda e, b: b), TreeStateful)
    saved = trainer.tree_state_dict()
    other.load_tree_state_dict(saved)
    assert sorted(other.tree_state_dict()) == sorted(saved)
    for path, array in other.tree_state_dict().items():
        np.testing.assert_array_equal(np.asarray(array), np.asarray(saved[path]))
    saver = Checkpoint({"trainer": trainer}, tmp_path, background=False)
    saver(trainer)
    info = saver.store.latest()
    assert info is not None
    assert sorted(info.manifest["metadata"]["state_dicts"]) == ["trainer"]
