"""Ignite 0.5.5's metric lines that reached ember in issue 47's second round.

``Fbeta(precision=, recall=)``, multilabel ``ROC_AUC``, ``Precision``/``Recall`` with ``is_multilabel=True``.

Ignite's values were recorded with torch 2.13.0 (CPU) and pytorch-ignite 0.5.5: each metric attached to an engine
run once on ``[[y_pred, y]]`` with the arrays below as tensors (``ignite.metrics.Fbeta``, ``Precision``, ``Recall``,
``ROC_AUC``), e.g. ``Fbeta(1.0, precision=Precision(average=False, output_transform=ot), recall=Recall(
average=False, output_transform=ot))`` with ``ot = lambda o: (torch.round(o[0]), o[1])`` gave 0.7499999999999994.
"""

import re

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from ember import Engine
from ember.metrics import ROC_AUC, Fbeta, MetricsLambda, Precision, Recall

BINARY = (np.array([0.6, 0.2, 0.9, 0.4, 0.7, 0.65], np.float32), np.array([1, 0, 1, 1, 0, 1]))
MULTI = (
    np.array(
        [[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.3, 0.4, 0.3], [0.8, 0.1, 0.1], [0.1, 0.2, 0.7]],
        np.float32,
    ),
    np.array([1, 0, 2, 0, 0, 1]),
)
MULTILABEL = (
    np.array([[0.1, 0.9], [0.4, 0.2], [0.35, 0.6], [0.8, 0.3], [0.7, 0.65], [0.2, 0.1]], np.float32),
    np.array([[0, 1], [0, 0], [1, 1], [1, 0], [0, 1], [1, 0]]),
)


def run(metric, y_pred, y):
    engine = Engine(lambda e, b: b)
    metric.attach(engine, "m")
    return engine.run([(y_pred, y)]).metrics["m"]


def test_fbeta_of_a_precision_and_a_recall_is_ignites_composition():
    def rounded(out):
        return np.round(out[0]), out[1]

    p, r = Precision(average=False, output_transform=rounded), Recall(average=False, output_transform=rounded)
    composed = Fbeta(1.0, precision=p, recall=r)
    assert isinstance(composed, MetricsLambda)
    assert run(composed, *BINARY) == pytest.approx(0.7499999999999994, abs=1e-6)  # Ignite's documented example
    assert run(Fbeta(0.5, precision=Precision(average=False)), *MULTI) == pytest.approx(0.6548821548821541, abs=1e-6)
    per_class = run(Fbeta(2.0, average=False, recall=Recall(average=False)), *MULTI)
    np.testing.assert_allclose(per_class, [0.7142857142857141, 0.49999999999999983, 0.833333333333333], atol=1e-6)
    assert isinstance(Fbeta(1.0), Fbeta)  # without them, ember's own (its update folds into the step)


def test_fbeta_composition_refuses_what_ignite_refuses():
    with pytest.raises(ValueError, match=re.escape("`precision` must be a Precision made with average=False")):
        Fbeta(precision=Precision(average=True))
    with pytest.raises(ValueError, match=re.escape("`output_transform` must be None when `recall` is given")):
        Fbeta(recall=Recall(average=False), output_transform=lambda o: o)
    with pytest.raises(ValueError, match=re.escape("takes average=True or False (Ignite's), got 'micro'")):
        Fbeta(precision=Precision(average=False), average="micro")
    with pytest.raises(ValueError, match=re.escape("`beta` must be a positive number, got 0")):
        Fbeta(0, precision=Precision(average=False))


def test_roc_auc_of_multilabel_indicators_is_the_mean_of_the_labels_areas():
    assert run(ROC_AUC(), *MULTILABEL) == pytest.approx(0.7777777777777778)  # Ignite 0.5.5
    rng = np.random.default_rng(0)
    scores, labels = rng.random((50, 4)), (rng.random((50, 4)) > 0.5).astype(np.int32)
    assert run(ROC_AUC(), scores.astype(np.float32), labels) == pytest.approx(roc_auc_score(labels, scores))


def test_roc_auc_refuses_multiclass_class_indices_as_scikit_learn_does():
    with pytest.raises(ValueError, match=re.escape("ROC AUC got scores of shape (6, 3) and class indices of shape")):
        run(ROC_AUC(), *MULTI)
    with pytest.raises(ValueError, match=re.escape("the epoch had label 1 of 6 positive and 0 negative")):
        run(ROC_AUC(), MULTILABEL[0], np.stack([MULTILABEL[1][:, 0], np.ones(6, int)], axis=1))


# Ignite 0.5.5, Precision/Recall(average=..., is_multilabel=True) updated once with these tensors:
#   average=False: [0.5, 1.0, 0.6667] / [0.5, 1.0, 1.0]; True: 0.7222 / 0.8333; "micro": 0.7143 / 0.8333;
#   "weighted": 0.7222 / 0.8333
ML_PRED = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 1]], np.float32)
ML_TRUE = np.array([[1, 0, 0], [0, 1, 1], [0, 1, 0], [1, 0, 1]])


@pytest.mark.parametrize(
    ("average", "precision", "recall"),
    [
        (False, [0.5, 1.0, 2 / 3], [0.5, 1.0, 1.0]),
        (True, 0.7222222222222222, 0.8333333333333334),
        ("micro", 0.7142857142857143, 0.8333333333333334),
        ("weighted", 0.7222222222222222, 0.8333333333333334),
    ],
)
def test_multilabel_precision_and_recall_are_ignites(average, precision, recall):
    p = run(Precision(average=average, is_multilabel=True), ML_PRED, ML_TRUE)
    r = run(Recall(average=average, is_multilabel=True), ML_PRED, ML_TRUE)
    np.testing.assert_allclose(p, precision, rtol=1e-6)
    np.testing.assert_allclose(r, recall, rtol=1e-6)


def test_samples_average_is_each_examples_value_over_its_labels_averaged():
    """Ignite 0.5.5, ``average="samples", is_multilabel=True``, these rows plus an empty one: 0.6 and 0.7."""
    y_pred = np.concatenate([ML_PRED, np.zeros((1, 3), np.float32)])
    y = np.concatenate([ML_TRUE, [[0, 1, 0]]])
    assert run(Precision(average="samples", is_multilabel=True), y_pred, y) == pytest.approx(0.6)
    assert run(Recall(average="samples", is_multilabel=True), y_pred, y) == pytest.approx(0.7)
    folded = Precision(average="samples", is_multilabel=True, num_classes=3)  # its update folds into a step
    assert run(folded, y_pred, y) == pytest.approx(0.6)


def test_multilabel_refusals_name_the_problem():
    with pytest.raises(ValueError, match=re.escape("is_multilabel=True needs y_pred and y of one shape")):
        run(Precision(is_multilabel=True), ML_PRED, ML_TRUE[:, 0])
    with pytest.raises(ValueError, match=re.escape("`average='samples'` (each example's value over its labels")):
        Precision(average="samples")
    with pytest.raises(ValueError, match=re.escape("needs is_multilabel=True")):
        Fbeta(average="samples")


SCORES = np.array(
    [[0.9, 0.4, 0.2], [0.35, 0.6, 0.45], [0.1, 0.32, 0.8], [0.45, 0.05, 0.31], [0.2, 0.9, 0.1]], np.float32
)
LABELS = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 1], [1, 0, 1], [0, 1, 1]])


@pytest.mark.parametrize("metric", [Precision, Recall])
def test_masked_rows_are_left_out_of_the_samples_average(metric):
    """average="samples" with a mask: scikit-learn's value over the rows the mask keeps, not over every row."""
    from sklearn.metrics import precision_score, recall_score

    reference = {Precision: precision_score, Recall: recall_score}[metric]
    mask = np.array([1, 0, 1, 0, 1], np.float32)
    engine = Engine(lambda e, b: b)
    metric(average="samples", is_multilabel=True).attach(engine, "m")
    got = engine.run([{"y_pred": SCORES, "y": LABELS, "mask": mask}]).metrics["m"]
    kept = mask.astype(bool)
    expected = reference(LABELS[kept], (SCORES[kept] > 0.5).astype(int), average="samples", zero_division=0)
    assert got == pytest.approx(expected, rel=1e-6)
    assert got != pytest.approx(reference(LABELS, (SCORES > 0.5).astype(int), average="samples", zero_division=0))


@pytest.mark.parametrize("average", ["samples", "micro", "macro"])
def test_a_multilabel_threshold_applies_to_the_predictions_as_scikit_learns(average):
    """threshold=0.3: a score of 0.35 or 0.45 is a positive prediction; the 0/1 targets are what they are."""
    from sklearn.metrics import precision_score, recall_score

    for metric, reference in ((Precision, precision_score), (Recall, recall_score)):
        got = run(
            metric(average=True if average == "macro" else average, is_multilabel=True, threshold=0.3), SCORES, LABELS
        )
        expected = reference(LABELS, (SCORES > 0.3).astype(int), average=average, zero_division=0)
        assert got == pytest.approx(expected, rel=1e-6), metric.__name__
        assert got != pytest.approx(reference(LABELS, (SCORES > 0.5).astype(int), average=average, zero_division=0))
