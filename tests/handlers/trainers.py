"""A small real trainer shared by the handler tests: a linear classifier on the synthetic batches."""

from __future__ import annotations

import jax.numpy as jnp
import optax

from ember.training import TrainState, create_evaluator, create_trainer
from tests.training.models import batches, classification_loss

SCHEDULE = optax.linear_schedule(0.1, 0.0, transition_steps=16)
DATA = batches(4)


def linear_state(optimizer=None):
    params = {"w": jnp.zeros((4, 3)), "b": jnp.zeros(3)}
    return TrainState.create(lambda p, x: x @ p["w"] + p["b"], params, optimizer or optax.sgd(SCHEDULE))


def trainer(extras=(), optimizer=None, **kwargs):
    return create_trainer(linear_state(optimizer), classification_loss, extras=extras, lr_schedule=None, **kwargs)


def evaluator(source):
    def accuracy(model, batch):
        return {"correct": jnp.mean(jnp.argmax(model(batch["x"]), -1) == batch["y"])}

    return create_evaluator(source, accuracy)
