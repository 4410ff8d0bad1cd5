"""Issue 47's measure: an Ignite script runs unchanged except its imports.

It has its own Metric subclass, Precision/Recall defaults, a ProgressBar with ``file=`` and a Checkpoint on
EXCEPTION_RAISED.

The script below is Ignite 0.5.5's documented lines (the custom-metric guide's ``CustomAccuracy``, the metrics'
defaults, ``ProgressBar(file=log_file)``, ``trainer.add_event_handler(Events.EXCEPTION_RAISED, handler)``); only its
imports name ember, and its model step is numpy instead of torch.
"""

import io
import re

import numpy as np
import pytest

from ember import Engine, Events
from ember.handlers import Checkpoint, DiskSaver, ProgressBar
from ember.metrics import Precision, Recall
from tests.metrics.ignite_style_metrics import CustomAccuracy

Y_PRED = np.array([[0.9, 0.1, 0.0], [0.2, 0.7, 0.1], [0.1, 0.2, 0.7], [0.6, 0.3, 0.1]], np.float32)
Y = np.array([0, 1, 1, 0])


def test_an_ignite_script_runs_as_written(tmp_path):
    # ---- the script, as an Ignite user wrote it ----
    def validation_step(engine, batch):
        return batch

    evaluator = Engine(validation_step)
    CustomAccuracy().attach(evaluator, "accuracy")
    Precision().attach(evaluator, "precision")
    Recall().attach(evaluator, "recall")
    log_file = io.StringIO()
    ProgressBar(file=log_file, persist=True).attach(evaluator)
    state = evaluator.run([(Y_PRED, Y)])

    def train_step(engine, batch):
        if engine.state.iteration == 3:
            raise RuntimeError("out of memory")
        return batch

    trainer = Engine(train_step)
    handler = Checkpoint({"trainer": trainer}, DiskSaver(tmp_path, require_empty=False))
    trainer.add_event_handler(Events.EXCEPTION_RAISED, handler)
    with pytest.raises(RuntimeError, match="out of memory"):
        trainer.run([1, 2, 3, 4])
    # ---- what it did ----
    assert state.metrics["accuracy"] == 0.75
    np.testing.assert_allclose(state.metrics["precision"], [1.0, 1.0, 0.0])  # per class: Ignite's default
    np.testing.assert_allclose(state.metrics["recall"], [1.0, 0.5, 0.0])
    assert re.fullmatch(r"Iteration: \[1/1\] 00:0\d\n", log_file.getvalue())  # a file gets a line, not bar frames
    assert [c.path.name for c in handler.store.checkpoints()] == ["step_00000003"]
