"""A metric written Ignite's way (its own reset/update/compute, Ignite's decorators) runs in ember as written."""

import re

import numpy as np
import pytest

from ember import Engine, Events
from ember.metrics import Metric, sync_all_reduce
from tests.metrics.ignite_style_metrics import CustomAccuracy

rng = np.random.default_rng(0)
SCORES = rng.normal(size=(24, 3)).astype(np.float32)
LABELS = rng.integers(0, 3, size=24)
BATCHES = [(SCORES[i : i + 4], LABELS[i : i + 4]) for i in range(0, 24, 4)]


def expected(rows=slice(None)):
    return float(np.mean(SCORES[rows].argmax(1) == LABELS[rows]))


def test_ignites_documented_custom_metric_attaches_and_computes_each_epoch():
    """Reset at each epoch's start, updated with the output after output_transform, computed at its end."""
    engine = Engine(lambda e, batch: {"pred": batch[0], "label": batch[1]})
    CustomAccuracy(output_transform=lambda out: (out["pred"], out["label"])).attach(engine, "acc")
    seen = []
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: seen.append(e.state.metrics["acc"]))
    engine.run(BATCHES, max_epochs=2)
    assert seen == [expected(), expected()]  # the second epoch did not count the first's examples again
    ignored = CustomAccuracy(ignored_class=0)
    ignored.update((SCORES, LABELS))
    assert ignored.compute() == float(np.mean(SCORES[LABELS != 0].argmax(1) == LABELS[LABELS != 0]))
    with pytest.raises(ValueError, match="CustomAccuracy must have at least one example"):
        CustomAccuracy().compute()


def test_a_custom_metric_resumed_mid_epoch_computes_the_uninterrupted_value():
    """Its counters (those sync_all_reduce names) are in the engine's state dict, and survive the resumed STARTED."""
    engine = Engine(lambda e, batch: batch)
    CustomAccuracy().attach(engine, "acc")
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=3), lambda e: e.terminate(final=False))
    engine.run(BATCHES)
    saved = engine.state_dict()
    assert saved["attached"]["metric:acc"] == {
        "attributes": {"_num_examples": 12, "_num_correct": int(np.sum(SCORES[:12].argmax(1) == LABELS[:12]))},
        "updates": 3,
    }
    again = Engine(lambda e, batch: batch)
    CustomAccuracy().attach(again, "acc")
    again.load_state_dict(saved)
    assert again.run(BATCHES).metrics["acc"] == expected()


def test_ignites_other_arguments_and_a_wrong_operation_are_named():
    CustomAccuracy(device=None)
    with pytest.raises(TypeError, match=re.escape("`device` must be None, a device name such as 'cpu', a JAX device")):
        CustomAccuracy(device=3)
    with pytest.raises(ValueError, match=re.escape("sync_all_reduce: '_n:MEAN' names the operation 'MEAN'; the")):
        sync_all_reduce("_n:MEAN")
    assert not CustomAccuracy().fusable  # updated by a handler, on the host, never inside a compiled step
    assert Metric.__init__.__defaults__ == (None, None, False)  # Ignite's output_transform, device, skip_unrolling


def test_a_mapping_output_gives_update_its_required_keys_as_ignite_does():
    engine = Engine(lambda e, batch: {"y_pred": batch[0], "y": batch[1], "loss": 0.0})
    CustomAccuracy().attach(engine, "acc")
    assert engine.run(BATCHES).metrics["acc"] == expected()
    broken = Engine(lambda e, batch: {"pred": batch[0], "y": batch[1]})
    CustomAccuracy().attach(broken, "acc")
    with pytest.raises(ValueError, match=re.escape("CustomAccuracy needs the keys ['y_pred', 'y'] in the output, but")):
        broken.run(BATCHES)


def test_a_metric_attached_under_the_empty_name_is_written_there_as_in_ignite():
    from ember.metrics import Sum

    engine = Engine(lambda e, batch: batch)
    Sum().attach(engine, "")
    assert engine.run([1.0, 2.0]).metrics == {"": 3.0}
    with pytest.raises(TypeError, match=re.escape("`name` must be a string, got int 3.")):
        Sum().attach(engine, 3)


# Ignite 0.5.5's values for these inputs, recorded with torch 2.13 (CPU) and pytorch-ignite 0.5.5:
#   from ignite.metrics import Precision, Recall, Fbeta; m = Precision(); m.update((torch.tensor(SCORES4),
#   torch.tensor(LABELS4))); m.compute()   ... for each call below
SCORES4 = np.array(
    [[0.9, 0.05, 0.03, 0.02], [0.1, 0.8, 0.05, 0.05], [0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7],
     [0.2, 0.1, 0.6, 0.1], [0.6, 0.2, 0.1, 0.1]],
    np.float32,
)  # fmt: skip
LABELS4 = np.array([0, 1, 2, 3, 0, 0])
IGNITE = [
    ("Precision", {}, [2 / 3, 1.0, 0.0, 1.0]),  # average=False, Ignite's default: the per-class values
    ("Recall", {}, [2 / 3, 1.0, 0.0, 1.0]),
    ("Precision", {"average": True}, 2 / 3),
    ("Recall", {"average": "micro"}, 2 / 3),
    ("Precision", {"average": "weighted"}, 2 / 3),
    ("Fbeta", {"beta": 1.0}, 2 / 3),  # Fbeta's default is average=True in Ignite
]


@pytest.mark.parametrize(("name", "kwargs", "expected"), IGNITE)
def test_precision_recall_and_fbeta_defaults_give_ignites_values(name, kwargs, expected):
    from ember import metrics

    metric = getattr(metrics, name)(**kwargs)
    metric.update((SCORES4, LABELS4))
    np.testing.assert_allclose(np.asarray(metric.compute()), expected, rtol=1e-6)


def test_epoch_metric_applies_compute_fn_to_the_whole_epoch_as_ignite():
    from sklearn.metrics import median_absolute_error

    from ember.metrics import EpochMetric

    engine = Engine(lambda e, batch: batch)
    binary = [(SCORES[i : i + 4, 0], (LABELS[i : i + 4] == 0).astype(np.int32)) for i in range(0, 24, 4)]
    EpochMetric(lambda y_pred, y: median_absolute_error(y, y_pred)).attach(engine, "median")  # not a mean of batches
    assert engine.run(binary).metrics["median"] == median_absolute_error(LABELS == 0, SCORES[:, 0])
    failing = EpochMetric(lambda y_pred, y: 1 / 0)
    with pytest.warns(RuntimeWarning, match=re.escape("EpochMetric: `compute_fn` fails on the first batch: Zero")):
        failing.update(binary[0])
    EpochMetric(lambda y_pred, y: 1 / 0, check_compute_fn=False).update(binary[0])  # no check, no warning
    with pytest.raises(TypeError, match=re.escape("`compute_fn` must be callable as compute_fn(y_pred, y), got 3.")):
        EpochMetric(3)


def test_ignites_names_for_top_k_and_roc_auc():
    from sklearn.metrics import roc_auc_score, top_k_accuracy_score

    from ember.metrics import ROC_AUC, RocAuc, TopKCategoricalAccuracy

    top = TopKCategoricalAccuracy(2)  # Ignite's k first; its default is 5
    top.update((SCORES, LABELS))
    assert top.compute() == pytest.approx(top_k_accuracy_score(LABELS, SCORES, k=2))
    assert TopKCategoricalAccuracy().k == 5
    assert ROC_AUC is RocAuc
    auc = ROC_AUC()
    auc.update((SCORES[:, 1], (LABELS == 1).astype(np.int32)))
    assert auc.compute() == pytest.approx(roc_auc_score(LABELS == 1, SCORES[:, 1]))


def test_frequency_counts_items_per_second_from_each_epochs_start_as_ignite():
    """10 items an iteration, 0.5 s apart: 20 per second, reset at each epoch's start, written at event_name."""
    from ember.metrics import Frequency

    now = [0.0]
    engine = Engine(lambda e, batch: (now.__setitem__(0, now[0] + 0.5), {"ntokens": 10})[1])
    Frequency(output_transform=lambda out: out["ntokens"], clock=lambda: now[0]).attach(
        engine, "tps", event_name=Events.EPOCH_COMPLETED
    )
    seen = []
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: seen.append(e.state.metrics["tps"]))
    now[0] = 100.0  # the clock's origin does not matter
    engine.run(range(4), max_epochs=2)
    assert seen == [20, 20]
    assert isinstance(seen[0], int)  # Ignite writes an int


def _every_metric_an_ignite_script_makes_with_a_device():
    """Ignite 0.5.5's metrics that take ``device``, each made as an Ignite script makes it (their other arguments)."""
    import optax

    from ember import metrics as m

    def loss(y_pred, y):
        return optax.softmax_cross_entropy_with_integer_labels(y_pred, y).mean()

    made = {
        "Accuracy": lambda device: m.Accuracy(device=device),
        "Loss": lambda device: m.Loss(loss, device=device),
        "ConfusionMatrix": lambda device: m.ConfusionMatrix(3, device=device),
        "RunningAverage": lambda device: m.RunningAverage(output_transform=lambda x: x, device=device),
        "ROC_AUC": lambda device: m.ROC_AUC(device=device),
        "EpochMetric": lambda device: m.EpochMetric(lambda p, y: 0.0, device=device),
        "Fbeta": lambda device: m.Fbeta(1.0, device=device),
        "Fbeta of a Precision and a Recall": lambda device: m.Fbeta(
            1.0, precision=m.Precision(average=False), recall=m.Recall(average=False), device=device
        ),
        "Precision": lambda device: m.Precision(device=device),
        "Recall": lambda device: m.Recall(device=device),
        "Average": lambda device: m.Average(device=device),
        "R2Score": lambda device: m.R2Score(device=device),
        "MeanAbsoluteError": lambda device: m.MeanAbsoluteError(device=device),
        "MeanSquaredError": lambda device: m.MeanSquaredError(device=device),
        "RootMeanSquaredError": lambda device: m.RootMeanSquaredError(device=device),
        "TopKCategoricalAccuracy": lambda device: m.TopKCategoricalAccuracy(device=device),
        "Frequency": lambda device: m.Frequency(device=device),
    }
    return made


@pytest.mark.parametrize("name", sorted(_every_metric_an_ignite_script_makes_with_a_device()))
def test_every_metric_an_ignite_script_makes_takes_device_and_checks_it(name):
    """``device="cpu"``, a JAX device and ``None`` are taken; a number is refused with the one message."""
    import jax

    make = _every_metric_an_ignite_script_makes_with_a_device()[name]
    for device in ("cpu", jax.devices()[0], None):
        make(device)
    with pytest.raises(TypeError, match=re.escape("`device` must be None, a device name such as 'cpu', a JAX device")):
        make(3)
