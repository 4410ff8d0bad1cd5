"""Figures as images for writers: a confusion matrix (matplotlib, an optional extra)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ember._extras import missing


def confusion_matrix_image(
    matrix: Any, class_names: Sequence[str] | None = None, *, normalize: bool = True, title: str = ""
) -> np.ndarray:
    """Draw a confusion matrix (rows: true class, columns: predicted) as an ``(H, W, 3)`` uint8 image.

    Give it ``ConfusionMatrix.compute()`` and pass the result to ``writer.write_image``; TensorBoard shows
    it under Images. With ``normalize`` each row is divided by its total (recall per class on the
    diagonal); the cells show the numbers. Needs matplotlib (``pip install -e ".[plots]"``); drawing
    uses the non-interactive Agg backend, so no display is needed.

    Args:
        matrix: a square array of counts.
        class_names: tick labels (``0..n-1`` by default).
        normalize: divide each row by its sum.
        title: drawn above the matrix.

    Examples:
        >>> import numpy as np
        >>> from ember.writers import confusion_matrix_image
        >>> image = confusion_matrix_image(np.array([[5, 1], [2, 8]]), ["cat", "dog"])
        >>> image.dtype.name, image.ndim, image.shape[2]
        ('uint8', 3, 3)
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(missing("confusion_matrix_image", "matplotlib", "plots")) from e
    m = np.asarray(matrix, np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"`matrix` must be square (classes x classes), got shape {m.shape}.")
    n = m.shape[0]
    names = list(class_names) if class_names is not None else [str(i) for i in range(n)]
    if len(names) != n:
        raise ValueError(f"`class_names` must name the {n} classes, got {len(names)} names.")
    if normalize:
        m = m / np.maximum(m.sum(axis=1, keepdims=True), 1e-12)
    size = 2.0 + 0.45 * n
    fig = Figure(figsize=(size, size), dpi=80)  # a Figure without pyplot: no global state, no display
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.imshow(m, cmap="Blues", vmin=0.0, vmax=1.0 if normalize else None)
    ax.set(xticks=range(n), yticks=range(n), xticklabels=names, yticklabels=names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if title:
        ax.set_title(title)
    if n <= 20:
        threshold = (m.max() or 1.0) / 2
        for i in range(n):
            for j in range(n):
                text = f"{m[i, j]:.2f}" if normalize else f"{m[i, j]:.0f}"
                ax.text(j, i, text, ha="center", va="center", color="white" if m[i, j] > threshold else "black")
    fig.tight_layout()
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
