"""Every built-in against scikit-learn (or NumPy), over several batches, with edge cases and masks."""

import re

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as skm

from ember.metrics import (
    Accuracy,
    Average,
    Collect,
    ConfusionMatrix,
    Fbeta,
    IoU,
    Last,
    Loss,
    Max,
    MeanAbsoluteError,
    MeanSquaredError,
    Min,
    Perplexity,
    Precision,
    R2Score,
    Recall,
    RocAuc,
    RootMeanSquaredError,
    Std,
    Sum,
    TopKAccuracy,
    mIoU,
)

RNG = np.random.default_rng(0)


def feed(metric, *arrays, batch=7, mask=None):
    """Update ``metric`` batch by batch (the last batch may be of one) and compute."""
    n = len(arrays[0])
    for i in range(0, n, batch):
        out = {"y_pred": jnp.asarray(arrays[0][i : i + batch]), "y": jnp.asarray(arrays[1][i : i + batch])}
        if mask is not None:
            out["mask"] = jnp.asarray(mask[i : i + batch])
        metric.update(out)
    return metric.compute()


def multiclass(n=50, c=4, missing=None):
    scores = RNG.normal(size=(n, c)).astype(np.float32)
    y = RNG.integers(0, c, size=n)
    if missing is not None:  # a class that never appears in y
        y[y == missing] = (missing + 1) % c
    return scores, y


@pytest.mark.parametrize("n", [50, 43])  # 43: the last batch of 7 holds one example
def test_multiclass_accuracy_matches_sklearn(n):
    """Argmax accuracy over batches equals accuracy_score on everything."""
    scores, y = multiclass(n)
    assert feed(Accuracy(), scores, y) == pytest.approx(skm.accuracy_score(y, scores.argmax(1)))


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 5).flatmap(
        lambda c: st.tuples(
            st.lists(
                st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, np.inf, -np.inf, np.nan]), min_size=c, max_size=c),
                min_size=1,
                max_size=6,
            ),
            st.lists(st.integers(-1, c), min_size=6, max_size=6),
        )
    )
)
def test_accuracy_counts_exactly_what_argmax_counts(case):
    """Ties (first index wins), NaN (the largest), infinities, -0.0 and out-of-range labels: as NumPy's argmax."""
    rows, labels = case
    scores = jnp.asarray(np.array(rows, np.float32))
    y = jnp.asarray(np.array(labels[: len(rows)], np.int32))
    want = np.argmax(np.array(rows, np.float32), axis=-1) == np.array(labels[: len(rows)])
    correct, count = Accuracy().batch_state(scores, y)
    assert (float(correct), float(count)) == (float(want.sum()), float(len(rows)))


def test_binary_and_multilabel_accuracy_match_sklearn():
    """Thresholded binary accuracy and exact-match multilabel accuracy equal scikit-learn's."""
    p, y = RNG.random(40).astype(np.float32), RNG.integers(0, 2, 40)
    assert feed(Accuracy(), p, y) == pytest.approx(skm.accuracy_score(y, p > 0.5))
    pm, ym = RNG.random((40, 3)).astype(np.float32), RNG.integers(0, 2, (40, 3))
    assert feed(Accuracy(is_multilabel=True), pm, ym) == pytest.approx(skm.accuracy_score(ym, pm > 0.5))


def test_all_correct_all_wrong_and_masked_accuracy():
    """Edge cases: 1.0 when all correct, 0.0 when all wrong; masked examples do not count."""
    y = np.array([0, 1, 2, 1])
    right = np.eye(3, dtype=np.float32)[y]
    wrong = np.eye(3, dtype=np.float32)[(y + 1) % 3]
    assert feed(Accuracy(), right, y) == 1.0
    assert feed(Accuracy(), wrong, y) == 0.0
    mixed = np.concatenate([right[:2], wrong[2:]])
    assert feed(Accuracy(), mixed, y, mask=np.array([1, 1, 0, 0])) == 1.0


def test_top_k_accuracy_matches_sklearn():
    """TopKAccuracy equals top_k_accuracy_score."""
    scores, y = multiclass(60, 5)
    want = skm.top_k_accuracy_score(y, scores, k=2, labels=range(5))
    assert feed(TopKAccuracy(k=2), scores, y) == pytest.approx(want)


@pytest.mark.parametrize("average", ["macro", "micro", "weighted", None])
@pytest.mark.parametrize("missing", [None, 2])
def test_precision_recall_fbeta_match_sklearn(average, missing):
    """Precision, Recall, F1 and F2 equal scikit-learn's for every averaging, with a class absent from y."""
    scores, y = multiclass(60, 4, missing)
    pred = scores.argmax(1)
    kw = {"average": average, "labels": range(4), "zero_division": 0}
    np.testing.assert_allclose(
        feed(Precision(average=average), scores, y), skm.precision_score(y, pred, **kw), atol=1e-6
    )
    np.testing.assert_allclose(feed(Recall(average=average), scores, y), skm.recall_score(y, pred, **kw), atol=1e-6)
    np.testing.assert_allclose(feed(Fbeta(1.0, average=average), scores, y), skm.f1_score(y, pred, **kw), atol=1e-6)
    np.testing.assert_allclose(
        feed(Fbeta(2.0, average=average), scores, y), skm.fbeta_score(y, pred, beta=2.0, **kw), atol=1e-6
    )


def test_binary_precision_recall_match_sklearn():
    """With scores and labels of one shape, the positive class's precision and recall are reported."""
    p, y = RNG.random(50).astype(np.float32), RNG.integers(0, 2, 50)
    assert feed(Precision(), p, y) == pytest.approx(skm.precision_score(y, p > 0.5))
    assert feed(Recall(), p, y) == pytest.approx(skm.recall_score(y, p > 0.5))


def test_confusion_matrix_and_iou_match_sklearn():
    """ConfusionMatrix equals confusion_matrix; IoU and mIoU equal jaccard_score per class and its mean."""
    scores, y = multiclass(70, 3)
    cm = ConfusionMatrix(num_classes=3)
    iou, miou = IoU(cm), mIoU(cm)
    got = feed(cm, scores, y)
    np.testing.assert_array_equal(got, skm.confusion_matrix(y, scores.argmax(1), labels=range(3)))
    np.testing.assert_allclose(iou.compute(), skm.jaccard_score(y, scores.argmax(1), average=None), atol=1e-6)
    assert miou.compute() == pytest.approx(skm.jaccard_score(y, scores.argmax(1), average="macro"))
    assert IoU(cm, ignore_index=0).compute().shape == (2,)


def test_regression_errors_match_sklearn():
    """MSE, MAE and RMSE equal scikit-learn's, also with a mask."""
    p, y = RNG.normal(size=45).astype(np.float32), RNG.normal(size=45).astype(np.float32)
    assert feed(MeanSquaredError(), p, y) == pytest.approx(skm.mean_squared_error(y, p), rel=1e-5)
    assert feed(MeanAbsoluteError(), p, y) == pytest.approx(skm.mean_absolute_error(y, p), rel=1e-5)
    assert feed(RootMeanSquaredError(), p, y) == pytest.approx(np.sqrt(skm.mean_squared_error(y, p)), rel=1e-5)
    mask = (RNG.random(45) > 0.3).astype(np.float32)
    keep = mask > 0
    assert feed(MeanSquaredError(), p, y, mask=mask) == pytest.approx(
        skm.mean_squared_error(y[keep], p[keep]), rel=1e-5
    )


def test_reductions_and_loss_match_numpy():
    """Average, Sum, Min, Max and Loss over batches equal NumPy on everything."""
    values = RNG.normal(size=33).astype(np.float32)
    for metric, want in (
        (Average(), values.mean()),
        (Sum(), values.sum()),
        (Min(), values.min()),
        (Max(), values.max()),
    ):
        for i in range(0, 33, 8):
            metric.update(jnp.asarray(values[i : i + 8]))
        assert metric.compute() == pytest.approx(want, rel=1e-5)
    p, y = RNG.normal(size=30).astype(np.float32), RNG.normal(size=30).astype(np.float32)
    assert feed(Loss(lambda a, b: (a - b) ** 2), p, y) == pytest.approx(np.mean((p - y) ** 2), rel=1e-5)


def test_a_leading_device_axis_reduces_like_flat_examples():
    """Outputs of a pmapped step, (devices, batch, ...), give the same values as the flat batch."""
    scores, y = multiclass(48, 4)
    flat = [Accuracy(), Precision(), ConfusionMatrix(4), TopKAccuracy(2)]
    stacked = [Accuracy(), Precision(), ConfusionMatrix(4), TopKAccuracy(2)]
    for a, b in zip(flat, stacked, strict=True):
        a.update({"y_pred": jnp.asarray(scores), "y": jnp.asarray(y)})
        b.update({"y_pred": jnp.asarray(scores.reshape(8, 6, 4)), "y": jnp.asarray(y.reshape(8, 6))})
        np.testing.assert_allclose(b.compute(), a.compute())


def test_std_r2_perplexity_match_numpy_and_sklearn():
    """Std equals numpy.std; R2Score equals r2_score (also masked); Perplexity is exp of the masked mean."""
    values = RNG.normal(loc=100.0, size=61).astype(np.float32)  # a large mean: the merge must stay stable
    std = Std()
    for i in range(0, 61, 8):
        std.update(jnp.asarray(values[i : i + 8]))
    assert std.compute() == pytest.approx(values.astype(np.float64).std(), rel=1e-4)
    p, y = RNG.normal(size=37).astype(np.float32), RNG.normal(size=37).astype(np.float32)
    assert feed(R2Score(), p, y) == pytest.approx(skm.r2_score(y, p), rel=1e-4)
    mask = (RNG.random(37) > 0.4).astype(np.float32)
    assert feed(R2Score(), p, y, mask=mask) == pytest.approx(skm.r2_score(y[mask > 0], p[mask > 0]), rel=1e-4)
    losses, tokens = RNG.random((6, 5)).astype(np.float32), (RNG.random((6, 5)) > 0.3).astype(np.float32)
    ppl = Perplexity(key="token_loss")
    for i in range(0, 6, 4):
        ppl.update({"token_loss": jnp.asarray(losses[i : i + 4]), "mask": jnp.asarray(tokens[i : i + 4])})
    assert ppl.compute() == pytest.approx(np.exp((losses * tokens).sum() / tokens.sum()), rel=1e-5)


def test_roc_auc_matches_sklearn_with_ties_and_masks():
    """RocAuc over collected batches equals roc_auc_score, ties included; masked examples are dropped."""
    scores = np.round(RNG.random(50), 1).astype(np.float32)  # many ties
    labels = RNG.integers(0, 2, 50)
    assert feed(RocAuc(), scores, labels) == pytest.approx(skm.roc_auc_score(labels, scores))
    mask = (RNG.random(50) > 0.5).astype(np.float32)
    keep = mask > 0
    assert feed(RocAuc(), scores, labels, mask=mask) == pytest.approx(skm.roc_auc_score(labels[keep], scores[keep]))
    with pytest.raises(ValueError, match=r"ROC AUC needs both classes; the epoch had 0 positive and 3 negative"):
        feed(RocAuc(), np.array([0.1, 0.2, 0.3], np.float32), np.zeros(3, int))


def test_last_and_collect_keep_what_they_see():
    """Last keeps the last update; Collect concatenates every batch, reading back only in compute()."""
    last = Last(output_transform=lambda out: out["y"])
    collect = Collect()
    got = feed(collect, np.arange(10, dtype=np.float32), np.arange(10), batch=3)
    feed(last, np.zeros(4), np.array([1, 2, 3, 4]), batch=3)
    assert last.compute().tolist() == [4]
    assert [c.tolist() for c in got] == [list(map(float, range(10))), list(range(10))]


@pytest.mark.parametrize("seed", range(5))
def test_masked_accuracy_equals_sklearn_on_the_examples_the_mask_keeps(seed):
    """Random scores, labels and masks, batches of 7: the accuracy of exactly the kept examples (scikit-learn's)."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(45, 4)).astype(np.float32)
    y = rng.integers(0, 4, size=45)
    mask = rng.random(45) < 0.6
    want = skm.accuracy_score(y[mask], scores[mask].argmax(1))
    assert feed(Accuracy(), scores, y, mask=mask.astype(np.float32)) == pytest.approx(want)


def test_a_score_exactly_at_the_threshold_is_negative_as_documented():
    """``y_pred > threshold`` is the positive class: a score of exactly 0.5 (or 0.7 with threshold=0.7) is not."""
    from ember.metrics import Accuracy, Precision, Recall

    at = jnp.array([0.5, 0.5, 0.9])
    labels = jnp.array([0, 0, 1])
    accuracy, precision, recall = Accuracy(), Precision(), Recall()
    for metric in (accuracy, precision, recall):
        metric.update((at, labels))
    assert (accuracy.compute(), float(precision.compute()), float(recall.compute())) == (1.0, 1.0, 1.0)
    high = Accuracy(threshold=0.7)
    high.update((jnp.array([0.7, 0.71]), jnp.array([0, 1])))
    assert high.compute() == 1.0


@pytest.mark.parametrize("bad", [-1, 3, 1.0, True])
def test_iou_refuses_an_ignore_index_that_is_not_a_class(bad):
    """Ignite raises ValueError for these; -1 used to drop the last class silently."""
    from ember.metrics import ConfusionMatrix, IoU, mIoU

    message = re.escape(f"`ignore_index` must be a class index in [0, 3) or None, got {bad!r}.")
    for make in (IoU, mIoU):
        with pytest.raises(ValueError, match=message):
            make(ConfusionMatrix(num_classes=3), ignore_index=bad)
    cm = ConfusionMatrix(num_classes=3)
    cm.update((jnp.eye(3), jnp.array([0, 1, 1])))
    assert IoU(cm, ignore_index=2).compute().tolist() == [1.0, 0.5]


def test_confusion_matrix_averages_as_ignite_and_iou_takes_only_counts_or_samples():
    scores = jnp.array([[0.9, 0.1, 0.0], [0.3, 0.7, 0.0], [0.6, 0.4, 0.0], [0.1, 0.2, 0.7]])
    labels = jnp.array([0, 1, 1, 1])
    values = {}
    for average in (None, "samples", "recall", "precision"):
        cm = ConfusionMatrix(3, average=average)
        cm.update((scores, labels))
        values[average] = np.asarray(cm.compute()).tolist()
    assert values[None] == [[1, 0, 0], [1, 1, 1], [0, 0, 0]]
    assert values["samples"] == [[0.25, 0.0, 0.0], [0.25, 0.25, 0.25], [0.0, 0.0, 0.0]]
    np.testing.assert_allclose(values["recall"], [[1, 0, 0], [1 / 3, 1 / 3, 1 / 3], [0, 0, 0]], rtol=1e-6)
    np.testing.assert_allclose(values["precision"], [[0.5, 0, 0], [0.5, 1, 1], [0, 0, 0]], rtol=1e-6)
    with pytest.raises(ValueError, match=re.escape("IoU needs a ConfusionMatrix with average None or 'samples', got")):
        IoU(ConfusionMatrix(3, average="recall"))
    with pytest.raises(ValueError, match=re.escape("`average` must be None, 'samples', 'recall' or 'precision', got")):
        ConfusionMatrix(3, average="macro")
