"""Metrics written as Ignite's documentation writes them (``ignite.metrics.Metric`` subclasses), for the tests.

``CustomAccuracy`` is the example of Ignite 0.5.5's "How to create a custom metric" (the ``device`` argument and the
two decorators included), with torch replaced by numpy.
"""

import numpy as np

from ember.metrics import Metric, reinit__is_reduced, sync_all_reduce


class CustomAccuracy(Metric):
    def __init__(self, ignored_class=None, output_transform=lambda x: x, device="cpu"):
        self.ignored_class = ignored_class
        self._num_correct = None
        self._num_examples = None
        super().__init__(output_transform=output_transform, device=device)

    @reinit__is_reduced
    def reset(self):
        self._num_correct = 0
        self._num_examples = 0
        super().reset()

    @reinit__is_reduced
    def update(self, output):
        y_pred, y = np.asarray(output[0]), np.asarray(output[1])
        indices = np.argmax(y_pred, axis=1)
        mask = y != self.ignored_class if self.ignored_class is not None else np.ones_like(y, bool)
        correct = np.equal(indices[mask], y[mask])
        self._num_correct += int(correct.sum())
        self._num_examples += int(correct.shape[0])

    @sync_all_reduce("_num_examples", "_num_correct:SUM")
    def compute(self):
        if self._num_examples == 0:
            raise ValueError("CustomAccuracy must have at least one example before it can be computed.")
        return self._num_correct / self._num_examples
