"""RollbackOnDivergence: a poisoned window of batches on a real model is skipped, rolled back over, and left out."""

import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from sklearn.datasets import load_digits

from ember import Events
from ember.handlers import Checkpoint, RollbackOnDivergence
from ember.training import TrainState, create_trainer
from tests.training.models import DigitsMLP, xent_loss


def _digits(n):
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return [{"x": x[i * 32 : (i + 1) * 32], "y": y[i * 32 : (i + 1) * 32].astype(np.int32)} for i in range(n)]


def _trainer(folder, every=4):
    state = TrainState.from_linen(DigitsMLP(), jnp.ones((1, 64)), optax.adam(1e-2))
    trainer = create_trainer(state, xent_loss, skip_nonfinite=True, spike_factor=20.0)
    saver = Checkpoint({"trainer": trainer}, folder, n_saved=None)
    saver.attach(trainer, Events.ITERATION_COMPLETED(every=every))
    return trainer, saver


def test_a_poisoned_window_is_rolled_back_and_the_run_ends_as_without_it(tmp_path, caplog):
    """A NaN, a 1e6-scaled batch and a NaN in a row: three skipped steps, then one rollback.

    Batches 18-20: the rollback goes to the checkpoint of iteration 16, and the final parameters equal a run over
    the same data without the window it left out.
    """
    data = _digits(30)
    data[17] = {**data[17], "x": np.where(np.arange(64) == 3, np.nan, data[17]["x"]).astype(np.float32)}
    data[18] = {**data[18], "x": data[18]["x"] * 1e6}
    data[19] = {**data[19], "x": np.full_like(data[19]["x"], np.nan)}
    trainer, saver = _trainer(tmp_path / "a")
    rollback = RollbackOnDivergence(saver, after=3)
    rollback.attach(trainer)
    reasons = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: reasons.append(int(e.state.output["skip_reason"])))
    with caplog.at_level(logging.WARNING, logger="ember.handlers._resilience.rollback"):
        trainer.run(data)
    assert trainer.state.iteration == 30
    assert reasons[17:20] == [1, 3, 1]
    assert [str(r) for r in rollback.rollbacks] == [
        "Rolled back to the checkpoint of iteration 16 after 3 skipped steps in a row (iterations 18-20, the last "
        "for a non-finite loss); the batches of iterations 17-21 are left out."
    ]
    assert [r.getMessage() for r in caplog.records] == [str(rollback.rollbacks[0])]
    first, last = rollback.rollbacks[0].dropped
    clean, _ = _trainer(tmp_path / "b")
    clean.run([b for i, b in enumerate(data, 1) if not first <= i <= last])
    a, b = trainer.state.train_state, clean.state.train_state
    for x, y in zip(jax.tree.leaves((a.params, a.opt_state)), jax.tree.leaves((b.params, b.opt_state)), strict=True):
        assert np.array_equal(x, y)
    assert int(a.step) == int(b.step) == 30 - 5


def test_a_checkpoint_found_damaged_at_the_rollback_is_moved_aside_and_the_older_one_used(tmp_path):
    """The checkpoint of 16 is truncated before the rollback needs it: moved aside, and the run rolls back to 12."""
    data = _digits(30)
    for i in (17, 18, 19):
        data[i] = {**data[i], "x": np.full_like(data[i]["x"], np.nan)}
    trainer, saver = _trainer(tmp_path / "a")
    rollback = RollbackOnDivergence(saver, after=3)
    rollback.attach(trainer)

    def damage():
        saver.wait()
        data_file = tmp_path / "a" / "step_00000016" / "state.msgpack"
        data_file.write_bytes(data_file.read_bytes()[:-100])

    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=19), damage)
    with pytest.warns(UserWarning, match=re.escape("It was moved aside to 'corrupt-step_00000016' and skipped.")):
        trainer.run(data)
    assert [(r.restored, r.dropped) for r in rollback.rollbacks] == [(12, (13, 21))]
    assert (tmp_path / "a" / "corrupt-step_00000016").is_dir()  # kept for a person to look at
    clean, _ = _trainer(tmp_path / "b")
    clean.run([b for i, b in enumerate(data, 1) if not 13 <= i <= 21])
    a, b = trainer.state.train_state, clean.state.train_state
    for x, y in zip(jax.tree.leaves((a.params, a.opt_state)), jax.tree.leaves((b.params, b.opt_state)), strict=True):
        assert np.array_equal(x, y)


def test_diverging_again_over_the_same_checkpoint_stops_with_both_windows(tmp_path):
    data = _digits(16)
    for i in (5, 6, 8, 9):  # iterations 6-7 and 9-10: two streaks of two, both after the checkpoint of 5
        data[i] = {**data[i], "x": np.full_like(data[i]["x"], np.nan)}
    trainer, saver = _trainer(tmp_path, every=5)
    RollbackOnDivergence(saver, after=2).attach(trainer)
    with pytest.raises(
        RuntimeError,
        match=re.escape(
            "The run diverged again after rolling back to the checkpoint of iteration 5: iterations 9-10 were "
            "skipped (a non-finite loss), after iterations 6-7 the first time; stopping"
        ),
    ):
        trainer.run(data)


def test_it_needs_the_guard_and_a_checkpoint_of_the_trainer(tmp_path):
    state = TrainState.from_linen(DigitsMLP(), jnp.ones((1, 64)), optax.adam(1e-2))
    plain = create_trainer(state, xent_loss)
    RollbackOnDivergence(Checkpoint({"trainer": plain}, tmp_path / "p"), after=2).attach(plain)
    with pytest.raises(KeyError, match=re.escape("create_trainer(..., skip_nonfinite=True)")):
        plain.run(_digits(1))
    other, _ = _trainer(tmp_path / "o")
    with pytest.raises(ValueError, match=re.escape("The checkpoint does not save this trainer")):
        RollbackOnDivergence(Checkpoint({"trainer": plain}, tmp_path / "q")).attach(other)
    with pytest.raises(ValueError, match=re.escape("`after` must be an int >= 1, got 0.")):
        RollbackOnDivergence(Checkpoint({"trainer": plain}, tmp_path / "r"), after=0)
