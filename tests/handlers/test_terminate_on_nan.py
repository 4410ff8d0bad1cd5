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
