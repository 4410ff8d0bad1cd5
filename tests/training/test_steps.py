import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx

from ember.training import TrainState, make_eval_step, make_train_step
from tests.training.models import LinenNet, NNXNet, batches, classification_loss

STEP = jax.jit(make_train_step(classification_loss))


def linen_state(seed=0):
    return TrainState.from_linen(LinenNet(), jnp.ones((2, 4)), optax.adam(1e-2), seed=seed, rngs=("dropout",))


def test_step_updates_params_model_state_and_step_and_returns_aux():
    """One step changes params and batch statistics, counts the step, and returns loss and logits."""
    state = linen_state()
    new, out = STEP(state, batches(1)[0])
    assert int(new.step) == 1
    assert sorted(out) == ["logits", "loss"]
    assert out["logits"].shape == (16, 3)
    assert out["loss"].shape == ()
    assert not np.allclose(new.params["Dense_0"]["kernel"], state.params["Dense_0"]["kernel"])
    assert not np.allclose(new.model_state["batch_stats"]["BatchNorm_0"]["mean"], 0.0)


class MaskNet(nn.Module):
    """Its output is its dropout mask (1 kept, 0 dropped), whatever its parameter: a step's draw, made visible."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        scale = self.param("scale", nn.initializers.ones, (1,))
        return nn.Dropout(0.5, deterministic=not train)(jnp.ones((64,))) / 2 + 0.0 * scale * x.sum()


def test_dropout_differs_per_step_and_is_reproducible():
    """The step's key is fold_in(rng, step): each step draws another mask, a rerun draws the same ones."""
    step = jax.jit(make_train_step(lambda model, b: (jnp.sum(model(b)), {"mask": model(b)})))
    fresh = lambda: TrainState.from_linen(MaskNet(), jnp.ones((1,)), optax.sgd(0.1), rngs=("dropout",))  # noqa: E731
    state, masks = fresh(), []
    for _ in range(3):
        state, out = step(state, jnp.ones((1,)))
        masks.append(np.asarray(out["mask"]))
    assert all(set(np.unique(m).tolist()) == {0.0, 1.0} for m in masks)  # masks, half kept
    assert len({m.tobytes() for m in masks}) == 3  # a new mask every step
    again, replayed = fresh(), []
    for _ in range(3):
        again, out = step(again, jnp.ones((1,)))
        replayed.append(np.asarray(out["mask"]))
    assert [m.tolist() for m in replayed] == [m.tolist() for m in masks]  # the same masks on a rerun


def test_two_model_calls_in_one_loss_use_different_keys():
    """Each call of the bound model draws its own dropout key."""
    step = jax.jit(make_train_step(lambda model, b: (0.0 * jnp.sum(model(b)), {"a": model(b), "b": model(b)})))
    _, out = step(linen_state(), jnp.ones((8, 4)))
    assert not np.allclose(out["a"], out["b"])


def test_nnx_model_trains_and_reseeds_dropout_per_step():
    """An NNX model trains through the same step; its dropout streams are reseeded from the step key."""
    state = TrainState.from_nnx(NNXNet(nnx.Rngs(0)), optax.adam(1e-2))
    step = jax.jit(make_train_step(classification_loss))
    data = batches(40)
    losses = []
    for b in data:
        state, out = step(state, b)
        losses.append(float(out["loss"]))
    assert int(state.step) == 40
    assert np.mean(losses[-10:]) < np.mean(losses[:10])
    s_a, o_a = step(TrainState.from_nnx(NNXNet(nnx.Rngs(0)), optax.adam(1e-2)), data[0])
    _, o_b = step(s_a, data[0])
    assert not np.allclose(o_a["logits"], o_b["logits"])


def test_gradient_accumulation_equals_one_big_batch():
    """accumulate_steps=4 over a batch of 16 gives the update of the whole batch (no batch norm, no dropout)."""
    state = TrainState.create(
        lambda p, x: x @ p["w"] + p["b"], {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}, optax.sgd(0.1)
    )
    batch = batches(1)[0]
    whole = jax.jit(make_train_step(classification_loss))
    micro = jax.jit(make_train_step(classification_loss, accumulate_steps=4))
    s1, o1 = whole(state, batch)
    s4, o4 = micro(state, batch)
    np.testing.assert_allclose(s4.params["w"], s1.params["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(o4["loss"], o1["loss"], rtol=1e-6)
    np.testing.assert_allclose(o4["logits"], o1["logits"], rtol=1e-6)
    assert int(s4.step) == 1


def test_extras_are_computed_only_when_asked():
    """grad_norm, update_norm, param_norm and lr appear when requested, with the right values."""
    state = TrainState.create(lambda p, x: x * p, jnp.array(1.0), optax.sgd(0.5))
    loss = lambda model, b: jnp.mean((model(b) - 3.0) ** 2)  # noqa: E731  # a one-line loss
    plain = make_train_step(loss)
    full = make_train_step(loss, extras=("grad_norm", "update_norm", "param_norm", "lr"), lr_schedule=lambda s: 0.5)
    assert sorted(plain(state, jnp.ones(4))[1]) == ["loss"]
    _, out = full(state, jnp.ones(4))
    assert {k: float(v) for k, v in out.items()} == {
        "loss": 4.0,
        "grad_norm": 4.0,
        "update_norm": 2.0,
        "param_norm": 3.0,
        "lr": 0.5,
    }


def test_lr_extra_reads_inject_hyperparams_state():
    """With optax.inject_hyperparams the lr extra follows the schedule, step by step."""
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=optax.linear_schedule(1.0, 0.0, 4))
    state = TrainState.create(lambda p, x: x * p, jnp.array(1.0), tx)
    step = jax.jit(make_train_step(lambda m, b: jnp.mean(m(b)), extras=("lr",)))
    lrs = []
    for _ in range(4):
        state, out = step(state, jnp.ones(2))
        lrs.append(float(out["lr"]))
    assert lrs == [1.0, 0.75, 0.5, 0.25]


def test_step_argument_errors():
    """Bad step-builder arguments fail when the step is built, naming the argument."""
    with pytest.raises(ValueError, match=r"Unknown `extras` \['gradnorm'\]; choose from"):
        make_train_step(lambda m, b: 0.0, extras=("gradnorm",))
    with pytest.raises(ValueError, match=r"`accumulate_steps` must be a positive int, got 0"):
        make_train_step(lambda m, b: 0.0, accumulate_steps=0)
    with pytest.raises(TypeError, match=r"`loss_fn` must be callable"):
        make_train_step(None)  # type: ignore[arg-type]
    state = TrainState.create(lambda p, x: x * p, jnp.array(1.0), optax.adam(1e-3))
    with pytest.raises(ValueError, match=r"extras=\('lr',\) needs the learning rate"):
        make_train_step(lambda m, b: jnp.mean(m(b)), extras=("lr",))(state, jnp.ones(2))
    with pytest.raises(ValueError, match=r"`accumulate_steps`=3 must divide the batch's leading axis; .* \(4,\)"):
        make_train_step(lambda m, b: jnp.mean(m(b)), accumulate_steps=3)(state, jnp.ones(4))
    with pytest.raises(ValueError, match=r"may not use the key 'loss'"):
        make_train_step(lambda m, b: (jnp.mean(m(b)), {"loss": 1.0}))(state, jnp.ones(2))


def test_eval_step_runs_the_model_in_eval_mode():
    """The eval step uses running statistics and no dropout: the same input gives the same output."""
    state = linen_state()
    step = jax.jit(make_eval_step(lambda model, b: model(b)))
    x = jnp.ones((4, 4))
    np.testing.assert_array_equal(step(state, x), step(state, x))
    assert step(state, x).shape == (4, 3)


@pytest.mark.parametrize(
    ("loss_fn", "returned"),
    [
        (lambda m, b: m(b), "an array of shape (3,) and dtype float32. Reduce a per-example loss with .mean()."),
        (
            lambda m, b: (m(b).mean(), {}, 1),
            "a tuple of 3 (an array of shape () and dtype float32, a dict, a value of type int).",
        ),
        (lambda m, b: jnp.int32(1), "an array of shape () and dtype int32."),
        (
            lambda m, b: [m(b), {}],
            "a list of 2 (an array of shape (3,) and dtype float32, a dict). Reduce a per-example loss with .mean().",
        ),
    ],
)
def test_a_loss_fn_returning_anything_but_a_scalar_is_named_at_tracing(loss_fn, returned):
    """A vector, a 3-tuple or an int loss: the error states the rule and what came back, not a tracer dump."""
    state = TrainState.create(lambda p, x: x * p, jnp.zeros(3), optax.sgd(0.1))
    step = make_train_step(loss_fn)
    message = "`loss_fn` must return a float scalar loss, or (loss, aux) with aux a dict; it returned " + returned
    with pytest.raises(TypeError, match="^" + re.escape(message)):
        jax.jit(step)(state, jnp.ones(3))


@pytest.mark.parametrize(("batch", "steps"), [(12, 3), (10, 5), (8, 8)])
def test_gradient_accumulation_on_a_trainer_equals_the_whole_batch_for_another_model_and_loss(batch, steps):
    """Another path and shape: a trainer, a mean squared error, 5 features: accumulate_steps=k equals one batch."""
    from ember.training import create_trainer

    rng = np.random.default_rng(batch)
    data = [{"x": rng.normal(size=(batch, 5)).astype(np.float32), "y": rng.normal(size=(batch,)).astype(np.float32)}]

    def loss(model, b):
        return jnp.mean((model(b["x"]) - b["y"]) ** 2)

    def trained(**kwargs):
        state = TrainState.create(
            lambda p, x: x @ p["w"] + p["b"], {"w": jnp.zeros(5), "b": jnp.zeros(())}, optax.sgd(0.1)
        )
        return create_trainer(state, loss, **kwargs).run(data * 3).train_state.params

    whole, accumulated = trained(), trained(accumulate_steps=steps)
    np.testing.assert_allclose(accumulated["w"], whole["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(accumulated["b"], whole["b"], rtol=1e-5, atol=1e-6)
