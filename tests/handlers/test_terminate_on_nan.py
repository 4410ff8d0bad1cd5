import re

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ember import Engine, Events
from ember.handlers import NonFiniteError, TerminateOnNan
from ember.training import TrainState, create_trainer


def nan_trainer(bad_step):
    """A real compiled trainer whose loss turns NaN at iteration ``bad_step`` (the batch carries it)."""
    state = TrainState.create(lambda p, x: x * p, jnp.array(1.0), optax.sgd(0.01))
    trainer = create_trainer(state, lambda m, b: jnp.mean((m(b) - 1.0) ** 2))
    data = [np.full(2, np.nan if i == bad_step else 1.0, np.float32) for i in range(1, 9)]
    return trainer, data


def test_terminates_one_iteration_after_the_nan_without_reading_each_step_synchronously():
    trainer, data = nan_trainer(3)
    guard = TerminateOnNan(lambda out: out["loss"])
    guard.attach(trainer)
    seen = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(e.state.iteration))
    trainer.add_event_handler(Events.COMPLETED, lambda e: seen.append("completed"))
    trainer.run(data)
    assert guard.nan_iteration == 3
    assert seen == [1, 2, 3, 4, "completed"]


def test_raise_action_raises_with_the_iteration():
    trainer, data = nan_trainer(5)
    TerminateOnNan(action="raise").attach(trainer)
    with pytest.raises(NonFiniteError, match=r"^A NaN or infinite output at iteration 5 \(seen at iteration 6\)\.$"):
        trainer.run(data)


def test_nan_on_the_last_iteration_is_caught_at_completed():
    trainer, data = nan_trainer(8)
    TerminateOnNan(action="raise").attach(trainer)
    with pytest.raises(NonFiniteError, match="iteration 8 "):
        trainer.run(data)


def test_infinity_and_integer_leaves():
    """Infinities count; integer leaves are ignored."""
    engine = Engine(lambda e, b: {"loss": jnp.float32(b), "count": jnp.int32(1)})
    guard = TerminateOnNan()
    guard.attach(engine)
    assert engine.run([1.0, float("inf"), 1.0, 1.0]).iteration == 3
    assert guard.nan_iteration == 2


def test_a_finite_run_runs_to_the_end():
    trainer, data = nan_trainer(100)
    guard = TerminateOnNan(lambda out: out["loss"])
    guard.attach(trainer)
    assert trainer.run(data, max_epochs=2).iteration == 16
    assert guard.nan_iteration is None


def test_bad_arguments():
    with pytest.raises(ValueError, match=re.escape('`action` must be "terminate" or "raise", got \'stop\'.')):
        TerminateOnNan(action="stop")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=re.escape("`output_transform` must be callable, got 'loss'.")):
        TerminateOnNan("loss")  # type: ignore[arg-type]


def test_on_a_trainer_the_check_runs_inside_the_compiled_step_and_its_handle_takes_it_out():
    trainer, data = nan_trainer(3)
    guard = TerminateOnNan(lambda out: out["loss"])
    handle = guard.attach(trainer)
    assert [type(m).__name__ for m in trainer.fused_metrics] == ["_FiniteWatch"]
    assert trainer.run(data).iteration == 4
    assert guard.nan_iteration == 3
    handle.remove()
    assert trainer.fused_metrics == ()
    assert trainer.run(data).iteration == 8  # nothing checks any more


@pytest.mark.parametrize("bad_step", [2, 4, 8])
def test_with_k_steps_per_call_each_step_has_its_own_flag(bad_step):
    """Four steps per call: the NaN's own iteration is named; the stop waits for the group's end."""
    state = TrainState.create(lambda p, x: x * p, jnp.array(1.0), optax.sgd(0.01))
    trainer = create_trainer(state, lambda m, b: jnp.mean((m(b) - 1.0) ** 2), steps_per_call=4)
    data = [np.full(2, np.nan if i == bad_step else 1.0, np.float32) for i in range(1, 13)]
    guard = TerminateOnNan(lambda out: out["loss"])
    guard.attach(trainer)
    assert trainer.fused_metrics
    assert trainer.run(data).iteration == {2: 4, 4: 8, 8: 12}[bad_step]
    assert guard.nan_iteration == bad_step


def test_the_fused_check_makes_no_call_of_its_own_per_iteration(monkeypatch):
    """The check is traced into the step once; per iteration the handler only takes the step's flag."""
    import ember.handlers._resilience.terminate_on_nan as module

    calls = []
    check = module._all_finite
    monkeypatch.setattr(module, "_all_finite", lambda leaves: calls.append(len(leaves)) or check(leaves))
    trainer, data = nan_trainer(100)
    TerminateOnNan(lambda out: out["loss"]).attach(trainer)
    assert trainer.run(data, max_epochs=2).iteration == 16
    traced = len(calls)
    assert calls == [1] * traced  # the step's traces (its output's shape, its compilation)
    assert traced <= 2
    assert trainer.run(data, max_epochs=4).iteration == 32
    assert len(calls) == traced  # 16 more iterations, no call


def test_a_transform_that_needs_host_values_falls_back_to_a_check_per_iteration():
    trainer, data = nan_trainer(5)
    guard = TerminateOnNan(lambda out: float(out["loss"]))  # a host float: cannot be traced into the step
    guard.attach(trainer)
    assert trainer.run(data).iteration == 6
    assert guard.nan_iteration == 5


def test_a_new_run_starts_with_a_clean_count():
    """The count of non-finite steps is the run's: a second run of a finite data set is not stopped by the first's."""
    trainer, data = nan_trainer(2)
    guard = TerminateOnNan(lambda out: out["loss"])
    guard.attach(trainer)
    assert trainer.run(data).iteration == 3
    trainer.state.train_state = trainer.state.train_state.replace(params=jnp.array(1.0))
    trainer.state.max_epochs = None  # a fresh run
    assert trainer.run([np.ones(2, np.float32)] * 4).iteration == 4
    assert guard.nan_iteration is None
