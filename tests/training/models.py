"""Small models shared by the training tests: linen and NNX, with dropout and batch norm."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax import nnx


class LinenNet(nn.Module):
    """Dense -> BatchNorm -> relu -> Dropout -> Dense."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Dense(16)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
        x = nn.Dropout(0.2, deterministic=not train)(nn.relu(x))
        return nn.Dense(3)(x)


class SyncBNNet(nn.Module):
    """Dense -> BatchNorm over ``axis_name`` (global batch statistics under pmap) -> relu -> Dense."""

    axis_name: str | None = None

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Dense(16)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9, axis_name=self.axis_name)(x)
        return nn.Dense(3)(nn.relu(x))


class NNXNet(nnx.Module):
    """The same network in NNX."""

    def __init__(self, rngs: nnx.Rngs):
        self.dense1 = nnx.Linear(4, 16, rngs=rngs)
        self.bn = nnx.BatchNorm(16, momentum=0.9, rngs=rngs)
        self.dropout = nnx.Dropout(0.2, rngs=rngs)
        self.dense2 = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.dense2(self.dropout(nnx.relu(self.bn(self.dense1(x)))))


def classification_loss(model, batch):
    """Softmax cross-entropy, with the logits returned as an aux output."""
    logits = model(batch["x"])
    labels = batch["y"]
    loss = -jnp.mean(jnp.take_along_axis(jax_log_softmax(logits), labels[:, None], axis=1))
    return loss, {"logits": logits}


def jax_log_softmax(x):
    return x - jnp.log(jnp.sum(jnp.exp(x - x.max(-1, keepdims=True)), -1, keepdims=True)) - x.max(-1, keepdims=True)


def batches(n: int, size: int = 16, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n`` synthetic batches of 4 features and 3 classes, the same for the same seed."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(size=(size, 4)).astype(np.float32)
        out.append({"x": x, "y": (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 1).astype(np.int32)})
    return out


class DigitsMLP(nn.Module):
    """Dense(64) -> relu -> Dense(10): a classifier of the digits' 64 pixels (or any input)."""

    hidden: int = 64

    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(nn.relu(nn.Dense(self.hidden)(x)))


def xent_loss(model, batch):
    """The mean softmax cross-entropy of ``model(batch["x"])`` against the integer labels ``batch["y"]``."""
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()
