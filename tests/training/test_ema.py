import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ember import Events
from ember.handlers import Checkpoint
from ember.training import TrainState, create_evaluator, create_trainer, ema, ema_params

X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
Y = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
DATA = [(X, Y)] * 5


def new_trainer(tx):
    state = TrainState.create(lambda p, x: x @ p["w"] + p["b"], {"w": jnp.zeros(3), "b": jnp.zeros(())}, tx)
    return create_trainer(state, lambda model, batch: jnp.mean((model(batch[0]) - batch[1]) ** 2))


def test_the_average_follows_a_numpy_reference_over_50_steps():
    """Ignite's rule with its linear warm-up, updated every 2nd step: ema = (1 - m) * ema + m * params."""
    trainer = new_trainer(ema(optax.sgd(0.1), momentum=0.1, momentum_warmup=0.5, warmup_iters=10, every=2))
    seen = [jax.tree.map(np.asarray, trainer.state.train_state.params)]
    trainer.add_event_handler(
        Events.ITERATION_COMPLETED, lambda e: seen.append(jax.tree.map(np.asarray, e.state.train_state.params))
    )
    trainer.run(DATA, max_epochs=10)  # 50 steps
    reference = {k: v.astype(np.float64) for k, v in seen[0].items()}
    for step in range(2, 51, 2):
        update = step // 2
        m = max(0.1, 0.5 + (0.1 - 0.5) * (update - 1) / 9)  # Ignite's EMAWarmUp: 0.5 down to 0.1, then 0.1
        reference = {k: (1 - m) * reference[k] + m * seen[step][k] for k in reference}
    averaged = ema_params(trainer.state.train_state)
    for k in reference:
        np.testing.assert_allclose(averaged[k], reference[k], rtol=1e-5, atol=1e-7)
    assert not np.allclose(averaged["w"], seen[-1]["w"])  # an average, not the last parameters


def test_a_resumed_run_continues_the_average_bit_for_bit(tmp_path):
    straight = new_trainer(ema(optax.adam(0.05), momentum=0.2))
    straight.run(DATA, max_epochs=4)
    first = new_trainer(ema(optax.adam(0.05), momentum=0.2))
    Checkpoint({"trainer": first}, tmp_path, n_saved=None).attach(first, Events.EPOCH_COMPLETED)
    first.add_event_handler(Events.EPOCH_COMPLETED(once=2), lambda e: e.terminate())
    first.run(DATA, max_epochs=4)
    resumed = new_trainer(ema(optax.adam(0.05), momentum=0.2))
    Checkpoint({"trainer": resumed}, tmp_path).resume()
    resumed.run(DATA)
    for a, b in zip(
        jax.tree.leaves(straight.state.train_state.opt_state),
        jax.tree.leaves(resumed.state.train_state.opt_state),
        strict=True,
    ):
        assert np.array_equal(a, b)


def test_an_evaluator_with_use_ema_sees_the_averaged_parameters():
    trainer = new_trainer(ema(optax.sgd(0.1), momentum=0.3))
    trainer.run(DATA, max_epochs=2)
    outputs = {
        use: create_evaluator(trainer, lambda model, batch: model(batch[0]), use_ema=use).run(DATA[:1]).output
        for use in (False, True)
    }
    state = trainer.state.train_state
    averaged = ema_params(state)
    np.testing.assert_allclose(outputs[True], X @ averaged["w"] + averaged["b"], rtol=1e-6)
    np.testing.assert_allclose(outputs[False], X @ state.params["w"] + state.params["b"], rtol=1e-6)
    plain = new_trainer(optax.sgd(0.1))
    message = "use_ema / ema_params need the train state's optimizer wrapped once in ember.training.ema(tx, ...)"
    with pytest.raises(ValueError, match=re.escape(message)):
        create_evaluator(plain, lambda model, batch: model(batch[0]), use_ema=True).run(DATA[:1])


def test_ema_arguments_are_checked():
    with pytest.raises(ValueError, match=re.escape("`momentum` must be a number in (0, 1), got 1.5.")):
        ema(optax.sgd(0.1), momentum=1.5)
    with pytest.raises(ValueError, match=re.escape("`momentum_warmup` and `warmup_iters` go together")):
        ema(optax.sgd(0.1), momentum_warmup=0.5)
    with pytest.raises(ValueError, match=re.escape("`every` must be a positive int, got 0.")):
        ema(optax.sgd(0.1), every=0)
