"""A model whose initial bias depends on the process that builds it: a resume that cannot be exact.

Used by tests/cli/test_verify_resume.py (``model.name=tests.cli.unseeded_model:Unseeded``): the straight run and
the run that is killed start from different parameters, as a model seeded from the clock or the process would.
"""

import os

import jax.numpy as jnp
from flax import linen as nn


class Unseeded(nn.Module):
    """Flattened inputs, one dense layer, and a bias from the process id."""

    num_classes: int = 10

    @nn.compact
    def __call__(self, x, train: bool = False):
        logits = nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))
        shift = self.param("shift", lambda key: jnp.full((self.num_classes,), os.getpid() % 997 / 997.0))
        return logits + shift
