"""Classification metrics: `Accuracy`, `TopKAccuracy`, and `Precision`, `Recall`, `Fbeta`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from ember.metrics._composite import MetricsLambda
from ember.metrics._ignite_style import check_device
from ember.metrics._mean import MeanMetric
from ember.metrics._metric import Metric

Average = Literal["macro", "micro", "weighted", "samples"] | bool | None

#: Ignite's ``average`` values by ember's: ``False`` the per-class values (``None``), ``True`` their mean (macro).
_IGNITE_AVERAGE = {False: None, True: "macro"}


def _weights(n: int, mask: Any) -> jax.Array:
    return jnp.ones((n,), jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32).reshape(n)


def _flatten(y_pred: Any, y: Any, mask: Any, label_dims: int) -> tuple[jax.Array, jax.Array, Any]:
    """Merge leading axes (such as pmap's device axis) into one example axis."""
    y_pred, y = jnp.asarray(y_pred), jnp.asarray(y)
    lead = y.shape[: y.ndim - label_dims]
    n = 1
    for d in lead:
        n *= d
    y_pred = y_pred.reshape((n, *y_pred.shape[len(lead) :]))
    y = y.reshape((n, *y.shape[len(lead) :]))
    return y_pred, y, (None if mask is None else jnp.asarray(mask).reshape(n))


class Accuracy(MeanMetric):
    """The fraction of correct predictions: binary, multiclass or multilabel.

    - multiclass: ``y_pred`` holds scores ``(..., C)`` and ``y`` class indices ``(...)``; the argmax counts;
    - binary: ``y_pred`` and ``y`` have the same shape; ``y_pred > threshold`` is the prediction;
    - multilabel (``is_multilabel=True``): ``y_pred`` and ``y`` are ``(..., L)``; an example is correct
      when every label is (exact match, as Ignite and scikit-learn).

    Leading axes (a device axis from ``pmap``) are examples too. Masked examples do not count.

    Args:
        is_multilabel: treat the last axis as independent labels.
        threshold: the decision threshold for binary and multilabel scores.
        output_transform: maps the output to ``(y_pred, y)`` or a mapping with those keys.
        mask_key: the output entry holding a per-example mask.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import Accuracy
        >>> acc = Accuracy()
        >>> acc.update((jnp.array([0.9, 0.2, 0.7]), jnp.array([1, 0, 0])))
        >>> round(acc.compute(), 4)
        0.6667
    """

    def __init__(
        self,
        *,
        is_multilabel: bool = False,
        threshold: float = 0.5,
        output_transform: Callable[[Any], Any] | None = None,
        mask_key: str | None = "mask",
        device: Any = None,
    ) -> None:
        self.is_multilabel = is_multilabel
        self.threshold = threshold
        super().__init__(output_transform, device, mask_key=mask_key)

    def batch_state(self, y_pred: Any, y: Any, mask: Any = None) -> Any:
        y_pred, y = jnp.asarray(y_pred), jnp.asarray(y)
        if self.is_multilabel:
            y_pred, y, mask = _flatten(y_pred, y, mask, 1)
            correct = jnp.all((y_pred > self.threshold) == (y > 0.5), axis=-1)
        elif y_pred.ndim == y.ndim + 1:  # multiclass scores
            y_pred, y, mask = _flatten(y_pred, y, mask, 0)
            correct = jnp.argmax(y_pred, axis=-1) == y  # ties to the first index, NaN as the largest
        elif y_pred.shape == y.shape:  # binary
            y_pred, y, mask = _flatten(y_pred, y, mask, 0)
            correct = (y_pred > self.threshold) == (y > 0.5)
        else:
            raise ValueError(
                f"Accuracy takes scores (..., C) with labels (...), or scores and labels of one shape; got y_pred "
                f"{y_pred.shape} and y {y.shape}."
            )
        w = _weights(correct.shape[0], mask)
        return (jnp.sum(correct * w), jnp.sum(w))


class TopKAccuracy(MeanMetric):
    """The fraction of examples whose label is among the ``k`` highest scores.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import TopKAccuracy
        >>> top2 = TopKAccuracy(k=2)
        >>> top2.update((jnp.array([[0.5, 0.3, 0.2], [0.1, 0.2, 0.7]]), jnp.array([1, 0])))
        >>> top2.compute()
        0.5
    """

    def __init__(
        self,
        k: int = 5,
        output_transform: Callable[[Any], Any] | None = None,
        device: Any = None,
        skip_unrolling: bool = False,
        *,
        mask_key: str | None = "mask",
    ) -> None:
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"`k` must be a positive int, got {k!r}.")
        self.k = k
        super().__init__(output_transform, device, mask_key=mask_key)

    def batch_state(self, y_pred: Any, y: Any, mask: Any = None) -> Any:
        y_pred, y, mask = _flatten(y_pred, y, mask, 0)
        _, top = jax.lax.top_k(y_pred, self.k)
        correct = jnp.any(top == y[:, None], axis=-1)
        w = _weights(correct.shape[0], mask)
        return (jnp.sum(correct * w), jnp.sum(w))


class _ClassCounts(Metric):
    """Per-class true positives, predicted counts and true counts; the base of Precision/Recall/Fbeta.

    Binary when ``y_pred`` and ``y`` share a shape (positive class: ``y_pred > threshold``), multiclass when
    ``y_pred`` has a class axis. With ``average=None`` the per-class values come back as an array. Giving
    ``num_classes`` (multiclass) lets a training engine fold the update into its compiled step.
    """

    def __init__(
        self,
        output_transform: Callable[[Any], Any] | None = None,
        average: Average = False,
        is_multilabel: bool = False,
        device: Any = None,
        *,
        num_classes: int | None = None,
        threshold: float = 0.5,
        mask_key: str | None = "mask",
    ) -> None:
        if not isinstance(is_multilabel, bool):
            raise TypeError(f"`is_multilabel` must be True or False, got {is_multilabel!r}.")
        if average not in ("macro", "micro", "weighted", "samples", None, True, False):
            raise ValueError(
                f"`average` must be False (per class, Ignite's default), True or 'macro', 'micro', 'weighted', "
                f"'samples' (multilabel), or None (per class), got {average!r}."
            )
        if average == "samples" and not is_multilabel:
            raise ValueError(
                "`average='samples'` (each example's value over its labels, averaged) needs is_multilabel=True; "
                "binary and multiclass data have one label per example (Ignite refuses it too)."
            )
        chosen: str | None = _IGNITE_AVERAGE[average] if isinstance(average, bool) else average
        if num_classes is not None and (
            not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 2
        ):
            raise ValueError(f"`num_classes` must be an int >= 2 or None, got {num_classes!r}.")
        self.average = chosen
        self.num_classes = num_classes
        self.threshold = threshold
        self.is_multilabel = is_multilabel
        self._binary = False
        super().__init__(output_transform, device, mask_key=mask_key)

    def empty(self) -> Any:
        if self.num_classes is None:
            return None  # the class count comes from the first batch
        zeros = jnp.zeros((1 if self.average == "samples" else self.num_classes,), jnp.float32)
        return (zeros, zeros, zeros)

    def _per_example(self, tp: jax.Array, pred: jax.Array, true: jax.Array) -> jax.Array:
        """Each example's value from its counts over its labels (``average="samples"``)."""
        raise NotImplementedError

    def batch_state(self, y_pred: Any, y: Any, mask: Any = None) -> Any:
        y_pred, y = jnp.asarray(y_pred), jnp.asarray(y)
        if self.is_multilabel:  # (n, labels, ...): each label a binary problem of its own
            if y_pred.shape != y.shape or y.ndim < 2:
                raise ValueError(
                    f"is_multilabel=True needs y_pred and y of one shape (examples, labels, ...), got {y_pred.shape} "
                    f"and {y.shape}."
                )
            (n, labels), rest = y.shape[:2], y.shape[2:]
            if mask is not None:  # one per example: for each of its positions too
                mask = jnp.broadcast_to(jnp.asarray(mask).reshape((n,) + (1,) * len(rest)), (n, *rest))
            y_pred, y = jnp.moveaxis(y_pred, 1, -1).reshape(-1, labels), jnp.moveaxis(y, 1, -1).reshape(-1, labels)
            pred, true = (y_pred > self.threshold).astype(jnp.float32), (y > 0.5).astype(jnp.float32)
            w = _weights(pred.shape[0], mask)[:, None]
            if self.average == "samples":  # (the sum of the examples' values, their count, their count)
                each = self._per_example(jnp.sum(pred * true, 1), jnp.sum(pred, 1), jnp.sum(true, 1))
                count = jnp.sum(w)[None]
                return (jnp.sum(each * w[:, 0])[None], count, count)
            return (jnp.sum(pred * true * w, 0), jnp.sum(pred * w, 0), jnp.sum(true * w, 0))
        if y_pred.shape == y.shape:  # binary: the positive class only
            self._binary = True
            y_pred, y, mask = _flatten(y_pred, y, mask, 0)
            pred = (y_pred > self.threshold).astype(jnp.float32)[:, None]
            true = (y > 0.5).astype(jnp.float32)[:, None]
        else:
            y_pred, y, mask = _flatten(y_pred, y, mask, 0)
            classes = y_pred.shape[-1]
            pred = jax.nn.one_hot(jnp.argmax(y_pred, axis=-1), classes)
            true = jax.nn.one_hot(y, classes)
        w = _weights(pred.shape[0], mask)[:, None]
        return (jnp.sum(pred * true * w, 0), jnp.sum(pred * w, 0), jnp.sum(true * w, 0))

    def _reduce(self, per_class: jax.Array, numerator: jax.Array, denominator: jax.Array, support: jax.Array) -> Any:
        if self._binary or self.average == "samples":  # one value: the positive class's, or the examples' mean
            return per_class[0]
        if self.average is None:
            return per_class
        if self.average == "micro":
            return _safe_div(jnp.sum(numerator), jnp.sum(denominator))
        if self.average == "weighted":
            return _safe_div(jnp.sum(per_class * support), jnp.sum(support))
        return jnp.mean(per_class)


def _safe_div(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a / b`` with 0 where ``b`` is 0 (scikit-learn's ``zero_division=0``)."""
    return jnp.where(b > 0, a / jnp.where(b > 0, b, 1), 0.0)


class Precision(_ClassCounts):
    """True positives over predicted positives, per class, or averaged.

    ``average`` is Ignite's: ``False`` (default) the per-class array on multiclass data (the positive class's value
    on binary data), ``True`` or ``"macro"`` their mean, ``"micro"``, ``"weighted"`` (by support); ``None`` is
    ``False``. A class never predicted counts 0. ``is_multilabel=True`` (Ignite's) takes ``y_pred`` and ``y`` of
    shape ``(examples, labels, ...)``, each label a binary problem (``y_pred > threshold``), averaged the same ways or
    with ``"samples"``: each example's value over its labels, averaged over the examples (Ignite's, scikit-learn's).

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import Precision
        >>> p = Precision()
        >>> p.update((jnp.array([1.0, 1.0, 0.0, 0.0]), jnp.array([1, 0, 1, 1])))
        >>> p.compute()
        0.5
    """

    def _per_example(self, tp: jax.Array, pred: jax.Array, true: jax.Array) -> jax.Array:
        return _safe_div(tp, pred)

    def finalize(self, state: Any) -> Any:
        tp, pred, true = state
        return self._reduce(_safe_div(tp, pred), tp, pred, true)


class Recall(_ClassCounts):
    """True positives over actual positives, per class, averaged like [`Precision`][ember.metrics.Precision].

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import Recall
        >>> r, macro = Recall(), Recall(average=True)  # per class (Ignite's default), and their mean
        >>> for m in (r, macro):
        ...     m.update((jnp.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]), jnp.array([0, 1, 1])))
        >>> r.compute().tolist(), macro.compute()
        ([1.0, 0.5], 0.75)
    """

    def _per_example(self, tp: jax.Array, pred: jax.Array, true: jax.Array) -> jax.Array:
        return _safe_div(tp, true)

    def finalize(self, state: Any) -> Any:
        tp, _, true = state
        return self._reduce(_safe_div(tp, true), tp, true, true)


class Fbeta(_ClassCounts):
    """The F-beta score per class, averaged like [`Precision`][ember.metrics.Precision].

    Per class ``(1 + b^2) TP / ((1 + b^2) TP + b^2 FN + FP)``; macro F1 is the mean of per-class F1, as
    scikit-learn computes it.

    Given Ignite's ``precision=`` and ``recall=`` (a `Precision` and a `Recall` made with ``average=False``; one
    given, the other is made with ``average=False`` and ``output_transform``), it is Ignite's composition of them: a
    [`MetricsLambda`][ember.metrics.MetricsLambda] computing ``(1 + b^2) p r / (b^2 p + r + 1e-15)`` per class, its
    mean with ``average=True``.

    Args:
        beta: the weight of recall against precision; 1 gives F1.
        precision: a `Precision(average=False)` to compose (Ignite's); ``output_transform`` is then its own.
        recall: a `Recall(average=False)` to compose (Ignite's).

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import Fbeta, Precision, Recall
        >>> f1 = Fbeta(beta=1.0)
        >>> f1.update((jnp.array([1.0, 1.0, 0.0, 0.0]), jnp.array([1, 0, 1, 1])))
        >>> round(f1.compute(), 4)
        0.4
        >>> composed = Fbeta(1.0, precision=Precision(average=False), recall=Recall(average=False))
        >>> composed.update((jnp.array([1.0, 1.0, 0.0, 0.0]), jnp.array([1, 0, 1, 1])))
        >>> round(composed.compute(), 4)
        0.4
    """

    def __new__(
        cls,
        beta: float = 1.0,
        *,
        average: Average = True,
        num_classes: int | None = None,
        threshold: float = 0.5,
        output_transform: Callable[[Any], Any] | None = None,
        mask_key: str | None = "mask",
        precision: Precision | None = None,
        recall: Recall | None = None,
        device: Any = None,
    ) -> Any:
        if precision is None and recall is None:
            return super().__new__(cls)
        check_device(device)
        unused = {"num_classes": num_classes is not None, "threshold": threshold != 0.5, "mask_key": mask_key != "mask"}
        if any(unused.values()):  # they belong to the Precision and Recall composed
            given = sorted(k for k, v in unused.items() if v)
            raise TypeError(f"Fbeta(precision=, recall=) takes beta, average and output_transform; got {given}.")
        return _fbeta_of(_beta(beta), precision, recall, average, output_transform)  # Ignite's: a MetricsLambda

    def __init__(
        self,
        beta: float = 1.0,
        *,
        average: Average = True,
        num_classes: int | None = None,
        threshold: float = 0.5,
        output_transform: Callable[[Any], Any] | None = None,
        mask_key: str | None = "mask",
        precision: Precision | None = None,
        recall: Recall | None = None,
        device: Any = None,
    ) -> None:
        self.beta = _beta(beta)
        super().__init__(
            device=device,
            average=average,
            num_classes=num_classes,
            threshold=threshold,
            output_transform=output_transform,
            mask_key=mask_key,
        )

    def finalize(self, state: Any) -> Any:
        tp, pred, true = state
        b2 = self.beta**2
        num = (1 + b2) * tp
        den = (1 + b2) * tp + b2 * (true - tp) + (pred - tp)
        return self._reduce(_safe_div(num, den), num, den, true)


def _beta(beta: Any) -> float:
    if isinstance(beta, bool) or not isinstance(beta, int | float) or beta <= 0:
        raise ValueError(f"`beta` must be a positive number, got {beta!r}.")
    return float(beta)


def _fbeta_of(
    beta: float,
    precision: Precision | None,
    recall: Recall | None,
    average: Average,
    output_transform: Callable[[Any], Any] | None,
) -> MetricsLambda:
    """Ignite's ``Fbeta(beta, average, precision, recall, output_transform)``: a composition of the two metrics."""
    if average not in (True, False):
        raise ValueError(f"Fbeta(precision=, recall=) takes average=True or False (Ignite's), got {average!r}.")
    given = {"precision": precision, "recall": recall}
    for name, metric in given.items():
        if metric is not None and output_transform is not None:
            raise ValueError(f"`output_transform` must be None when `{name}` is given (it is the {name}'s own).")
    made_p = precision if precision is not None else Precision(output_transform, average=False)
    made_r = recall if recall is not None else Recall(output_transform, average=False)
    for name, metric, kind in (("precision", made_p, Precision), ("recall", made_r, Recall)):
        if not isinstance(metric, kind) or metric.average is not None:
            got = f"average={metric.average!r}" if isinstance(metric, kind) else type(metric).__name__
            raise ValueError(f"`{name}` must be a {kind.__name__} made with average=False (per class), got {got}.")
    b2 = beta**2

    def fbeta(p: Any, r: Any) -> Any:
        value = (1.0 + b2) * np.asarray(p) * np.asarray(r) / (b2 * np.asarray(p) + np.asarray(r) + 1e-15)
        return float(np.mean(value)) if average else value

    return MetricsLambda(fbeta, made_p, made_r)


#: Ignite's name for [`TopKAccuracy`][ember.metrics.TopKAccuracy], which takes Ignite's arguments in its order.
TopKCategoricalAccuracy = TopKAccuracy
