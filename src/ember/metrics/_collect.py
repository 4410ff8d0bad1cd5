"""Metrics that keep what they see: `Last`, `Collect`, and `RocAuc`, `EpochMetric` (computed from what was kept)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ember.metrics._metric import Metric


class Last(Metric):
    """The value of the last update (any pytree), kept on device.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import Last
        >>> last = Last(output_transform=lambda out: out["loss"])
        >>> last.update({"loss": jnp.array(0.5)}); last.update({"loss": jnp.array(0.25)})
        >>> last.compute()
        0.25
    """

    keys = ("value",)

    def empty(self) -> Any:
        return None

    def batch_state(self, value: Any, mask: Any = None) -> Any:
        return value

    def merge(self, a: Any, b: Any) -> Any:
        return b

    def finalize(self, state: Any) -> Any:
        return state


class Collect(Metric):
    """Keeps every batch's values, on device, for metrics that need them all at the epoch's end.

    Updates append the (device) arrays without reading them; [`compute`][ember.metrics.Collect.compute] reads them back
    once and concatenates them along the example axis, dropping masked examples. Subclasses (such as
    [`RocAuc`][ember.metrics.RocAuc]) compute from the concatenated arrays in
    [`finalize_collected`][ember.metrics.Collect.finalize_collected].

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import Collect
        >>> collect = Collect()
        >>> collect.update({"y_pred": jnp.array([0.1, 0.2]), "y": jnp.array([0, 1]), "mask": jnp.array([1, 0])})
        >>> collect.update({"y_pred": jnp.array([0.3]), "y": jnp.array([1])})
        >>> [a.tolist() for a in collect.compute()]
        [[0.10000000149011612, 0.30000001192092896], [0, 1]]
    """

    updates_by_merge = False  # it keeps the batches themselves

    def __init__(
        self, output_transform: Callable[[Any], Any] | None = None, *, mask_key: str | None = "mask", device: Any = None
    ) -> None:
        self._batches: list[tuple[tuple[Any, ...], Any]] = []
        super().__init__(output_transform, device, mask_key=mask_key)

    def empty(self) -> Any:
        return None

    def reset(self) -> None:
        """Forget the collected batches."""
        self._batches = []
        super().reset()

    def update(self, output: Any) -> None:
        """Keep this batch's arrays (still on device)."""
        self._batches.append(self.arguments(output))
        self._updates += 1

    def _saved_state(self) -> Any:
        return [[list(args), mask] for args, mask in self._batches]  # a checkpoint carries every kept batch

    def _restore_state(self, state: Any) -> None:
        self._batches = [(tuple(args), mask) for args, mask in state or ()]  # None: another process's empty part

    def merge_processes(self, parts: list[Any]) -> Any:
        """Every process's batches, in process order."""
        return [batch for part in parts for batch in part]

    def compute(self) -> Any:
        """Read the collected arrays back once, concatenate them, and finalise."""
        if jax.process_count() > 1:  # on every process alike, whether it saw data or not
            raise NotImplementedError(
                f"{type(self).__name__} keeps each process's batches and cannot merge them across "
                f"{jax.process_count()} processes yet; compute it from a single-process evaluation."
            )
        if not self._updates:
            return super().compute()  # raises the "computed before any update" error
        host: list[tuple[tuple[Any, ...], Any]] = jax.device_get(self._batches)
        columns = [
            np.concatenate([np.asarray(args[i]).reshape(-1, *np.shape(args[i])[1:]) for args, _ in host])
            for i in range(len(host[0][0]))
        ]
        if any(mask is not None for _, mask in host):
            keep = np.concatenate(
                [np.ones(len(args[0]), bool) if m is None else np.asarray(m).reshape(-1) > 0 for args, m in host]
            )
            columns = [c[keep] for c in columns]
        return self.finalize_collected(*columns)

    def finalize_collected(self, *columns: np.ndarray) -> Any:
        """The value from the concatenated host arrays; the default returns them."""
        return list(columns)

    def finalize(self, state: Any) -> Any:
        return state

    def batch_state(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("Collect keeps batches as they come; it has no per-batch accumulators.")


def _average_ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), np.float64)
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


class RocAuc(Collect):
    """The area under the ROC curve, from all scores collected in the epoch: binary, or multilabel (Ignite's).

    Binary: scores and 0/1 labels of shape ``(n,)`` (or ``(n, 1)``). Multilabel: scores and 0/1 indicators of shape
    ``(n, k)``, the mean of the ``k`` labels' areas (scikit-learn's ``roc_auc_score`` default, ``average="macro"``,
    which Ignite's ``ROC_AUC`` calls). Computed exactly from the rank statistic (ties share their average rank).
    Every label must have both classes. Multiclass scores ``(n, k)`` with class indices ``(n,)`` are refused, as
    scikit-learn refuses them without ``multi_class``: one-hot the labels for one-vs-rest.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import RocAuc
        >>> auc = RocAuc()
        >>> auc.update((jnp.array([0.1, 0.4, 0.35, 0.8]), jnp.array([0, 0, 1, 1])))
        >>> auc.compute()
        0.75
        >>> multilabel = RocAuc()
        >>> multilabel.update((jnp.array([[0.1, 0.9], [0.4, 0.2], [0.35, 0.6], [0.8, 0.3]]),
        ...                    jnp.array([[0, 1], [0, 0], [1, 1], [1, 0]])))
        >>> multilabel.compute()  # (0.75 + 1.0) / 2
        0.875
    """

    def finalize_collected(self, *columns: np.ndarray) -> Any:
        scores, labels = columns[0].astype(np.float64), columns[1]
        if scores.ndim == 2 and scores.shape[1] > 1 and labels.ndim == 1:
            raise ValueError(
                f"ROC AUC got scores of shape {scores.shape} and class indices of shape {labels.shape} (multiclass); "
                "it takes binary labels or multilabel 0/1 indicators of the scores' shape (scikit-learn, which "
                "Ignite's ROC_AUC calls, refuses multiclass without multi_class): one-hot the labels for one-vs-rest."
            )
        if scores.ndim <= 1 or scores.shape[1:] == (1,):
            return _binary_auc(scores.reshape(-1), labels.reshape(-1) > 0.5)
        if labels.shape != scores.shape:
            raise ValueError(f"ROC AUC needs labels of the scores' shape {scores.shape}, got {labels.shape}.")
        return float(np.mean([_binary_auc(scores[:, j], labels[:, j] > 0.5, j) for j in range(scores.shape[1])]))


def _binary_auc(scores: np.ndarray, labels: np.ndarray, column: int | None = None) -> float:
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        which = "" if column is None else f" label {column} of"
        raise ValueError(
            f"ROC AUC needs both classes; the epoch had{which} {pos} positive and {neg} negative examples."
        )
    ranks = _average_ranks(scores)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


class EpochMetric(Collect):
    """Ignite's ``EpochMetric``: ``compute_fn(y_pred, y)`` over every prediction and target of the epoch.

    The batches are kept on device and read back once at ``compute`` as numpy arrays (Ignite hands tensors), masked
    examples dropped. With ``check_compute_fn`` (Ignite's default), ``compute_fn`` is tried on the first batch and a
    failure is a ``RuntimeWarning`` naming it, then, as in Ignite, training goes on.

    Args:
        compute_fn: ``compute_fn(y_pred, y)`` -> the value.
        output_transform: maps the engine's output to ``(y_pred, y)``.
        check_compute_fn: try ``compute_fn`` on the first batch.
        device: Ignite's argument, accepted and checked, not used.
        skip_unrolling: Ignite's argument, accepted.

    Examples:
        >>> import jax.numpy as jnp, numpy as np
        >>> from ember.metrics import EpochMetric
        >>> mae = EpochMetric(lambda y_pred, y: float(np.abs(y_pred - y).mean()))
        >>> mae.update((jnp.array([1.0, 2.0]), jnp.array([1.5, 2.0]))); mae.update((jnp.array([3.0]), jnp.array([2.0])))
        >>> mae.compute()
        0.5
    """

    def __init__(
        self,
        compute_fn: Callable[[np.ndarray, np.ndarray], Any],
        output_transform: Callable[[Any], Any] | None = None,
        check_compute_fn: bool = True,
        device: Any = None,
        skip_unrolling: bool = False,
        *,
        mask_key: str | None = "mask",
    ) -> None:
        if not callable(compute_fn):
            raise TypeError(f"`compute_fn` must be callable as compute_fn(y_pred, y), got {compute_fn!r}.")
        self.compute_fn, self.check_compute_fn = compute_fn, check_compute_fn
        super().__init__(output_transform, mask_key=mask_key, device=device)

    def update(self, output: Any) -> None:
        """Keep this batch; the first is tried with ``compute_fn`` if ``check_compute_fn``."""
        super().update(output)
        if self.check_compute_fn and self._updates == 1:
            try:
                self.compute()
            except Exception as e:  # Ignite's check: a warning, and the run goes on
                warnings.warn(f"EpochMetric: `compute_fn` fails on the first batch: {e!r}.", RuntimeWarning, 2)

    def finalize_collected(self, *columns: np.ndarray) -> Any:
        return self.compute_fn(*columns[:2])


#: Ignite's name for [`RocAuc`][ember.metrics.RocAuc] (binary or multilabel, as Ignite's ``ROC_AUC`` with scikit-learn).
ROC_AUC = RocAuc
