import math
import re

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ember import Engine, Events
from ember.training import ReduceLROnPlateau, TrainState, create_trainer, scale_by_plateau

# Scripted validation losses, none within rounding of a threshold.
LOSSES = [1.0, 0.9, 0.95, 0.92, 0.905, 0.85, 0.86, 0.87, 0.88, 0.83, 0.835, 0.834, 0.836, 0.7, 0.71, 0.72, 0.73, 0.74]


def keras_learning_rates(values, *, factor, patience, min_delta, cooldown, lr=1.0):
    """Keras 3's ReduceLROnPlateau.on_epoch_end, mode "min", min_lr 0: the learning rate after each epoch."""
    best, wait, cooldown_counter, out = math.inf, 0, 0, []
    for current in values:
        if cooldown_counter > 0:
            cooldown_counter -= 1
            wait = 0
        if current < best - min_delta:
            best, wait = current, 0
        elif cooldown_counter == 0:
            wait += 1
            if wait >= patience:
                lr, cooldown_counter, wait = lr * factor, cooldown, 0
        out.append(lr)
    return out


def trainer_and_evaluator():
    state = TrainState.create(lambda p, x: x * p, jnp.array(0.0), scale_by_plateau(optax.sgd(1.0)))
    trainer = create_trainer(state, lambda model, x: -model(x), extras=("lr",), lr_schedule=lambda step: 1.0)
    scripted = iter(LOSSES)
    evaluator = Engine(lambda e, b: None)
    evaluator.add_event_handler(Events.COMPLETED, lambda e: e.state.metrics.update(loss=next(scripted)))
    return trainer, evaluator


@pytest.mark.parametrize("cooldown", [0, 1, 2])
def test_the_scale_drops_at_the_epochs_keras_would_and_the_step_applies_it(cooldown):
    trainer, evaluator = trainer_and_evaluator()
    plateau = ReduceLROnPlateau(trainer, "loss", factor=0.5, patience=2, threshold=0.01, cooldown=cooldown)
    plateau.attach(evaluator)  # after the scripted metric, on the evaluator's COMPLETED
    scales, steps, lrs = [], [], []
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: evaluator.run([0]))
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: scales.append(plateau.scale))
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: lrs.append(float(e.state.output["lr"])))

    def parameter_step(engine):  # sgd(1.0) on -p * x with x = 1: each step adds the scale to p
        steps.append(float(engine.state.train_state.params))

    trainer.add_event_handler(Events.ITERATION_COMPLETED, parameter_step)
    trainer.run([jnp.array(1.0)], max_epochs=len(LOSSES))
    expected = keras_learning_rates(LOSSES, factor=0.5, patience=2, min_delta=0.01, cooldown=cooldown)
    assert scales == expected
    assert np.allclose(np.diff([0.0, *steps]), [1.0, *expected[:-1]])  # epoch e's step takes the scale set before
    assert lrs == [1.0, *expected[:-1]]  # extras=("lr",) reports the learning rate the step applied


def test_mode_max_watches_an_accuracy_and_errors_name_what_is_missing():
    trainer, _ = trainer_and_evaluator()
    evaluator = Engine(lambda e, b: None)
    plateau = ReduceLROnPlateau(trainer, "accuracy", mode="max", factor=0.1, patience=1)
    for accuracy in (0.5, 0.6, 0.6):
        evaluator.state.metrics["accuracy"] = accuracy
        plateau(evaluator)
    assert plateau.scale == pytest.approx(0.1)
    with pytest.raises(
        KeyError, match=re.escape("ReduceLROnPlateau watches 'accuracy'; the evaluator's metrics are []")
    ):
        plateau(Engine(lambda e, b: None))
    plain = create_trainer(TrainState.create(lambda p, x: x * p, jnp.array(0.0), optax.sgd(0.1)), lambda m, x: m(x))
    evaluator.state.metrics["loss"] = 1.0
    with pytest.raises(ValueError, match=re.escape("needs the trainer's optimizer wrapped once in")):
        ReduceLROnPlateau(plain, "loss")(evaluator)
    with pytest.raises(ValueError, match=re.escape("`factor` must be in (0, 1), got 2.")):
        ReduceLROnPlateau(plain, "loss", factor=2)


def test_it_watches_a_named_evaluation_at_the_trainers_event_after_the_evaluations_ran():
    """`ReduceLROnPlateau(trainer, "val_noisy/loss")` at EPOCH_COMPLETED reads what `Evaluations` published there."""
    from ember.handlers import Evaluations

    trainer, evaluator = trainer_and_evaluator()  # its metric: the scripted losses, one an evaluation
    plateau = ReduceLROnPlateau(trainer, "val_noisy/loss", factor=0.5, patience=2, threshold=0.01)
    scales = []
    trainer.add_event_handler(Events.EPOCH_COMPLETED, plateau)  # attached before the evaluations: they still run first
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: scales.append(plateau.scale))
    Evaluations(trainer).add("val_noisy", evaluator, [0], Events.EPOCH_COMPLETED, precompile=False)
    trainer.run([jnp.array(1.0)], max_epochs=len(LOSSES))
    assert scales == keras_learning_rates(LOSSES, factor=0.5, patience=2, min_delta=0.01, cooldown=0)
