"""skip_nonfinite and spike_factor: an update that is not finite, or spikes, is not applied, inside the step."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ember import Events
from ember.training import StepGuard, TrainState, create_trainer
from tests.training.models import DigitsMLP, xent_loss


def _state():
    return TrainState.from_linen(DigitsMLP(hidden=32), jnp.ones((8, 16)), optax.adam(1e-2))


def _batches(n, nan=(), scaled=()):
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        x = rng.normal(size=(8, 16)).astype(np.float32)
        if i in nan:
            x[0, 0] = np.nan
        if i in scaled:
            x *= 1e6
        out.append({"x": x, "y": np.arange(8, dtype=np.int32)})
    return out


def _run(trainer, data):
    seen = []

    @trainer.on(Events.ITERATION_COMPLETED)
    def record(engine):
        out, state = engine.state.output, engine.state.train_state
        counts = (int(out["skip_reason"]), int(out["skipped"]), int(out["consecutive_skips"]), int(state.step))
        seen.append((*counts, jax.device_get(state.params), jax.device_get(state.opt_state)))

    trainer.run(data)
    return seen


def _same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def test_a_non_finite_step_changes_nothing_and_says_why():
    """Iterations 3 and 4 carry a NaN: parameters, Adam's moments and the step counter stay; the reasons are named."""
    seen = _run(create_trainer(_state(), xent_loss, skip_nonfinite=True), _batches(6, nan=(2, 3)))
    assert [s[:4] for s in seen] == [(0, 0, 0, 1), (0, 0, 0, 2), (1, 1, 1, 2), (1, 2, 2, 2), (0, 2, 0, 3), (0, 2, 0, 4)]
    assert _same(seen[1][4:], seen[2][4:])
    assert _same(seen[1][4:], seen[3][4:])
    assert not _same(seen[3][4:], seen[4][4:])


def test_the_skipped_steps_leave_the_run_as_if_their_batches_were_not_there():
    """Skipping is exact: the final state equals a run over the same data without the poisoned batches."""
    data = _batches(8, nan=(3, 5))
    guarded = create_trainer(_state(), xent_loss, skip_nonfinite=True)
    guarded.run(data)
    clean = create_trainer(_state(), xent_loss, skip_nonfinite=True)
    clean.run([b for i, b in enumerate(data) if i not in (3, 5)])
    assert _same(guarded.state.train_state.params, clean.state.train_state.params)
    assert _same(guarded.state.train_state.opt_state, clean.state.train_state.opt_state)


def test_a_spike_in_the_loss_is_skipped_once_the_average_is_armed():
    """A batch scaled by 1e6 gives a finite but huge loss: a spike (reason 3) with spike_factor, applied without."""
    data = _batches(14, scaled=(12,))
    with_spikes = _run(create_trainer(_state(), xent_loss, skip_nonfinite=True, spike_factor=10.0), data)
    assert [s[0] for s in with_spikes] == [0] * 12 + [3, 0]
    without = _run(create_trainer(_state(), xent_loss, skip_nonfinite=True), data)
    assert [s[0] for s in without] == [0] * 14


def test_no_host_read_on_the_hot_path():
    trainer = create_trainer(_state(), xent_loss, skip_nonfinite=True, spike_factor=5.0)
    data = _batches(4, nan=(1,))
    trainer.run(data)  # compiled; one step skipped
    with jax.transfer_guard_device_to_host("disallow"):
        trainer.run(data, max_epochs=2)  # one more epoch
    assert int(trainer.state.train_state.guard.skipped) == 2


def test_k_steps_per_call_and_accumulation_skip_alike():
    data = _batches(8, nan=(2,))
    one = create_trainer(_state(), xent_loss, skip_nonfinite=True)
    one.run(data)
    grouped = create_trainer(_state(), xent_loss, skip_nonfinite=True, steps_per_call=4, accumulate_steps=2)
    grouped.run(data)
    assert int(grouped.state.train_state.guard.skipped) == 1
    assert int(grouped.state.train_state.step) == int(one.state.train_state.step) == 7


def test_the_guard_is_checked_when_made():
    with pytest.raises(ValueError, match=re.escape("`spike_factor` must be None or a number > 1, got 0.5.")):
        create_trainer(_state(), xent_loss, skip_nonfinite=True, spike_factor=0.5)
    with pytest.raises(ValueError, match=re.escape("`spike_factor` needs skip_nonfinite=True")):
        create_trainer(_state(), xent_loss, spike_factor=3.0)
    with pytest.raises(ValueError, match=re.escape("`warmup` must be an int >= 1, got 0.")):
        StepGuard.create(warmup=0)


def test_the_spike_check_arms_exactly_when_warmup_applied_steps_are_averaged():
    """warmup=3: a 100x loss after 2 applied steps is applied; after exactly 3, it is a spike (reason 3)."""
    for averaged, expected in ((2, 0), (3, 3)):
        guard = StepGuard.create(spike_factor=5.0, warmup=3)
        for _ in range(averaged):
            guard = guard.update(jnp.asarray(0, jnp.int32), jnp.asarray(1.0), jnp.asarray(1.0))
        assert int(guard.averaged) == averaged
        reason = guard.check(jnp.asarray(100.0), jnp.asarray(True), jnp.asarray(1.0))
        assert int(reason) == expected, averaged
