import re

import jax
import numpy as np
import optax
import pytest
from sklearn.datasets import load_digits

from ember.cli import DigitsCNN
from ember.data import ArrayDataset
from ember.training import TrainState, create_trainer, lr_find


def digits():
    data = load_digits()
    x = (data.images[..., None] / 16.0).astype(np.float32)
    return ArrayDataset((x, data.target.astype(np.int32)), batch_size=64, shuffle=True, seed=0)


def loss_fn(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch[0]), batch[1]).mean()


def cnn_trainer(tx):
    state = TrainState.from_linen(DigitsCNN(), np.zeros((1, 8, 8, 1), np.float32), tx, rngs=("dropout",))
    return create_trainer(state, loss_fn)


def test_the_range_test_on_the_digits_cnn_suggests_where_the_loss_falls_fastest_and_changes_nothing():
    trainer = cnn_trainer(optax.inject_hyperparams(optax.adam)(learning_rate=1e-3))
    before = jax.device_get(trainer.state.train_state)
    result = lr_find(trainer, digits(), start_lr=1e-5, end_lr=1.0, num_iter=60)
    after = jax.device_get(trainer.state.train_state)
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        assert np.array_equal(a, b)
    assert trainer.state.iteration == 0  # the trainer itself never ran
    falls = np.diff(result.losses)
    fastest = {result.lrs[i + 1] for i in np.flatnonzero(falls <= 0.5 * falls.min())}  # at least half the steepest
    assert result.suggestion in fastest
    assert 1e-4 < result.suggestion < 1e-1  # where Adam trains this CNN
    assert result.lrs == sorted(result.lrs)


def test_the_range_test_stops_when_the_loss_diverges_and_plots(tmp_path):
    trainer = cnn_trainer(optax.inject_hyperparams(optax.sgd)(learning_rate=0.1))
    result = lr_find(trainer, digits(), start_lr=1e-3, end_lr=1e4, num_iter=80, diverge=3.0)
    assert len(result.lrs) < 80
    assert result.losses[-1] > 3.0 * min(result.losses) or not np.isfinite(result.losses[-1])
    png = result.plot(tmp_path / "lr.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_optimizer_without_an_injected_learning_rate_is_refused():
    message = "lr_find sets the learning rate at each step: build the optimizer with optax.inject_hyperparams"
    with pytest.raises(ValueError, match=re.escape(message)):
        lr_find(cnn_trainer(optax.adam(1e-3)), digits(), num_iter=10)
    with pytest.raises(ValueError, match=re.escape("`start_lr` and `end_lr` must satisfy 0 < start_lr < end_lr")):
        lr_find(cnn_trainer(optax.adam(1e-3)), digits(), start_lr=1.0, end_lr=0.1)
