"""`ConfusionMatrix`, and `IoU` / `mIoU` computed from it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ember.metrics._classification import _flatten, _weights
from ember.metrics._composite import MetricsLambda
from ember.metrics._metric import Metric


class ConfusionMatrix(Metric):
    """Counts of (true class, predicted class) pairs, a ``(C, C)`` matrix with true classes on rows.

    ``y_pred`` holds scores ``(..., C)`` (argmax) and ``y`` class indices; leading axes (segmentation pixels,
    a device axis) are examples too. Masked examples do not count.

    Args:
        num_classes: C.
        average: Ignite's: ``None`` the counts; ``"samples"`` over all examples; ``"recall"`` each row over its sum
            (true classes); ``"precision"`` each column over its sum (predicted classes); an empty row or column
            gives 0.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import ConfusionMatrix
        >>> cm, recall = ConfusionMatrix(num_classes=2), ConfusionMatrix(2, average="recall")
        >>> for m in (cm, recall):
        ...     m.update((jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4]]), jnp.array([0, 1, 1])))
        >>> cm.compute().tolist(), recall.compute().tolist()
        ([[1, 0], [1, 1]], [[1.0, 0.0], [0.5, 0.5]])
    """

    def __init__(
        self,
        num_classes: int,
        average: str | None = None,
        *,
        output_transform: Callable[[Any], Any] | None = None,
        mask_key: str | None = "mask",
        device: Any = None,
    ) -> None:
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 2:
            raise ValueError(f"`num_classes` must be an int >= 2, got {num_classes!r}.")
        if average not in (None, "samples", "recall", "precision"):
            raise ValueError(f"`average` must be None, 'samples', 'recall' or 'precision', got {average!r}.")
        self.num_classes, self.average = num_classes, average
        super().__init__(output_transform, device, mask_key=mask_key)

    def empty(self) -> Any:
        return jnp.zeros((self.num_classes, self.num_classes), jnp.int32)

    def batch_state(self, y_pred: Any, y: Any, mask: Any = None) -> Any:
        y_pred, y, mask = _flatten(y_pred, y, mask, 0)
        if y_pred.shape[-1] != self.num_classes:
            raise ValueError(
                f"ConfusionMatrix(num_classes={self.num_classes}) got scores with {y_pred.shape[-1]} classes."
            )
        pred = jax.nn.one_hot(jnp.argmax(y_pred, -1), self.num_classes, dtype=jnp.int32)
        true = (
            jax.nn.one_hot(y, self.num_classes, dtype=jnp.int32) * _weights(y.shape[0], mask).astype(jnp.int32)[:, None]
        )
        return true.T @ pred

    def finalize(self, state: Any) -> Any:
        if self.average is None:
            return state
        counts = state.astype(jnp.float32)
        total = {
            "samples": jnp.sum(counts),
            "recall": jnp.sum(counts, axis=1, keepdims=True),
            "precision": jnp.sum(counts, axis=0, keepdims=True),
        }[self.average]
        return jnp.where(total > 0, counts / jnp.where(total > 0, total, 1), 0.0)


def IoU(cm: ConfusionMatrix, ignore_index: int | None = None) -> MetricsLambda:
    """Intersection over union per class, from a confusion matrix (a composite metric).

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import ConfusionMatrix, IoU
        >>> cm = ConfusionMatrix(num_classes=2)
        >>> cm.update((jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4]]), jnp.array([0, 1, 1])))
        >>> IoU(cm).compute().tolist()
        [0.5, 0.5]
    """
    if not isinstance(cm, ConfusionMatrix):
        raise TypeError(f"`cm` must be a ConfusionMatrix, got {type(cm).__name__}.")
    if cm.average not in (None, "samples"):  # Ignite's rule: a per-row or per-column normalisation is not IoU's input
        raise ValueError(f"IoU needs a ConfusionMatrix with average None or 'samples', got {cm.average!r}.")
    classes = cm.num_classes
    if ignore_index is not None and (
        not isinstance(ignore_index, int) or isinstance(ignore_index, bool) or not 0 <= ignore_index < classes
    ):  # Ignite raises ValueError too; a negative index would drop a class silently
        raise ValueError(f"`ignore_index` must be a class index in [0, {classes}) or None, got {ignore_index!r}.")

    def iou(matrix: np.ndarray) -> np.ndarray:
        matrix = np.asarray(matrix, np.float64)
        inter = np.diag(matrix)
        union = matrix.sum(0) + matrix.sum(1) - inter
        out = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
        return np.delete(out, ignore_index) if ignore_index is not None else out

    return MetricsLambda(iou, cm)


def mIoU(cm: ConfusionMatrix, ignore_index: int | None = None) -> MetricsLambda:
    """The mean of [`IoU`][ember.metrics.IoU] over classes.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import ConfusionMatrix, mIoU
        >>> cm = ConfusionMatrix(num_classes=2)
        >>> cm.update((jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4]]), jnp.array([0, 1, 1])))
        >>> float(mIoU(cm).compute())
        0.5
    """
    return IoU(cm, ignore_index).mean()
