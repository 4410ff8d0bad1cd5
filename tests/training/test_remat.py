"""Remat by name: the same numbers, the forward computed again in the backward pass."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from ember import Events
from ember.training import TrainState, create_trainer, make_train_step


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.tanh(nn.Dense(16)(x))
        return nn.Dense(3)(nn.tanh(nn.Dense(16)(x)))


def _loss(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()


def _state():
    return TrainState.from_linen(MLP(), jnp.ones((8, 4)), optax.adam(1e-2))


BATCH = {"x": jax.random.normal(jax.random.PRNGKey(1), (8, 4)), "y": jnp.arange(8) % 3}


def _dots(remat):
    """The matrix products in the lowered step (before XLA's optimisations, which could merge recomputation)."""
    lowered = jax.jit(make_train_step(_loss, remat=remat)).lower(_state(), BATCH).as_text()
    return len(re.findall(r"stablehlo\.dot_general", lowered))


def test_remat_computes_the_forward_again_in_the_backward_pass():
    """Three layers: 3 products forward and 5 backward; "full" recomputes the 3 forward ones, "dots_saveable" none."""
    assert _dots(None) == 8
    assert _dots("full") == 11
    assert _dots("nothing_saveable") == 11
    assert _dots("dots_saveable") == 8


@pytest.mark.parametrize("remat", ["full", "dots_saveable", "dots_with_no_batch_dims_saveable"])
def test_remat_trains_to_the_same_numbers(remat):
    """Five steps with and without: the same losses and parameters, to float32 rounding."""
    losses = {}
    for policy in (None, remat):
        trainer = create_trainer(_state(), _loss, remat=policy)
        seen = []
        trainer.add_event_handler(
            Events.ITERATION_COMPLETED, lambda e, seen=seen: seen.append(float(e.state.output["loss"]))
        )
        trainer.run([BATCH] * 5, max_epochs=1)
        losses[policy] = (seen, jax.tree.map(np.asarray, trainer.state.train_state.params))
    # the same computation to float32 rounding: XLA fuses a rematted function differently (about 1e-7 apart)
    np.testing.assert_allclose(losses[remat][0], losses[None][0], rtol=1e-6, atol=0)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), losses[remat][1], losses[None][1])


def test_an_unknown_policy_is_refused_with_the_names():
    with pytest.raises(ValueError, match=re.escape("`remat` must be None or one of ['dots_saveable', 'dots_with_no")):
        create_trainer(_state(), _loss, remat="dots")
