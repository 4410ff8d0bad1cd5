import re

import jax.numpy as jnp
import numpy as np
import optax
import optuna
import pytest

from ember import Engine, Events
from ember.handlers import OptunaPruning
from ember.metrics import Average
from ember.training import TrainState, create_evaluator, create_trainer

RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 4)).astype(np.float32)
Y = X @ np.array([1.0, -2.0, 0.5, 3.0], np.float32)
DATA = [(X[i : i + 16], Y[i : i + 16]) for i in range(0, 64, 16)]


def objective(trial: optuna.Trial) -> float:
    """A linear fit whose learning rate the study picks; the validation loss each epoch is reported."""
    lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    state = TrainState.create(lambda p, x: x @ p, jnp.zeros(4), optax.sgd(lr))
    trainer = create_trainer(state, lambda model, b: jnp.mean((model(b[0]) - b[1]) ** 2))
    evaluator = create_evaluator(trainer, lambda model, b: {"loss": jnp.mean((model(b[0]) - b[1]) ** 2)})
    Average(key="loss").attach(evaluator, "loss")
    OptunaPruning(trial, "loss", trainer).attach(evaluator)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: evaluator.run(DATA))
    trainer.run(DATA, max_epochs=8)
    return evaluator.state.metrics["loss"]


def test_a_median_pruner_prunes_the_trials_that_learn_slowly():
    """Six trials in memory: three good learning rates first, then three that barely learn; those are pruned."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(pruner=optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=2))
    for lr in (0.1, 0.05, 0.08, 1e-4, 2e-4, 0.09):
        study.enqueue_trial({"lr": lr})
    study.optimize(objective, n_trials=6)
    states = [trial.state for trial in study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * 3 + [optuna.trial.TrialState.PRUNED] * 2 + [
        optuna.trial.TrialState.COMPLETE
    ]
    assert [len(trial.intermediate_values) for trial in study.trials] == [8, 8, 8, 2, 2, 8]  # pruned at epoch 2
    assert study.best_trial.params["lr"] in (0.1, 0.09)


def test_the_metric_must_be_there():
    trial = optuna.create_study().ask()
    evaluator = Engine(lambda e, b: b)
    with pytest.raises(KeyError, match=re.escape("OptunaPruning reports 'loss'; the evaluator's metrics are []")):
        OptunaPruning(trial, "loss", Engine(lambda e, b: b))(evaluator)
    with pytest.raises(TypeError, match=re.escape("`trial` must be an optuna Trial, got str.")):
        OptunaPruning("trial", "loss", evaluator)  # type: ignore[arg-type]
