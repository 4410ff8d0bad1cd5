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

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import ConfusionMatrix
        >>> cm = ConfusionMatrix(num_classes=2)
        >>> cm.update((jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4]]), jnp.array([0, 1, 1])))
        >>> cm.compute().tolist()
        [[1, 0], [1, 1]]
    """

    def __init__(
        self, num_classes: int, *, output_transform: Callable[[Any], Any] | None = None, mask_key: str | None = "mask"
    ) -> None:
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 2:
            raise ValueError(f"`num_classes` must be an int >= 2, got {num_classes!r}.")
        self.num_classes = num_classes
        super().__init__(output_transform, mask_key=mask_key)

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
        return state


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
