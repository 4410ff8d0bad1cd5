import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from ember.training import TrainState
from tests.training.models import LinenNet, NNXNet


def test_from_linen_separates_params_from_other_collections():
    """A linen module's params and batch statistics land in params and model_state."""
    state = TrainState.from_linen(LinenNet(), jnp.ones((2, 4)), optax.adam(1e-3), seed=3, rngs=("dropout",))
    assert sorted(state.params) == ["BatchNorm_0", "Dense_0", "Dense_1"]
    assert sorted(state.model_state) == ["batch_stats"]
    assert state.params["Dense_0"]["kernel"].shape == (4, 16)
    assert int(state.step) == 0
    np.testing.assert_array_equal(state.model_state["batch_stats"]["BatchNorm_0"]["var"], np.ones(16))


def test_from_linen_is_seeded():
    """The same seed gives the same params; another seed different ones."""
    a, b, c = (TrainState.from_linen(LinenNet(), jnp.ones((2, 4)), optax.sgd(0.1), seed=s) for s in (0, 0, 1))
    k = lambda s: s.params["Dense_0"]["kernel"]  # noqa: E731  # a one-line accessor
    np.testing.assert_array_equal(k(a), k(b))
    assert not np.allclose(k(a), k(c))


def test_from_linen_initialises_in_one_program_as_flax_does_eagerly_and_keeps_python_values():
    """The params equal Flax's own eager init bit for bit; a Python value in the sample stays one (it steers code)."""
    from flax import linen as nn

    class Repeat(nn.Module):
        @nn.compact
        def __call__(self, x, times: int, train: bool = False):
            for _ in range(times):  # a Python loop over a Python int: a traced `times` could not steer it
                x = nn.Dense(3)(x)
            return nn.BatchNorm(use_running_average=not train)(x)

    sample = (np.ones((2, 4), np.float32), 2)
    state = TrainState.from_linen(Repeat(), sample, optax.sgd(0.1), seed=5)
    init_key = jax.random.split(jax.random.PRNGKey(5))[0]
    eager = Repeat().init({"params": jax.random.split(init_key, 1)[0]}, *sample)
    assert sorted(state.params) == ["BatchNorm_0", "Dense_0", "Dense_1"]
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(eager["params"]), strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(jax.tree.leaves(state.model_state), jax.tree.leaves(eager["batch_stats"]), strict=True):
        np.testing.assert_array_equal(got, want)


def test_from_linen_traces_an_equal_module_once_and_builds_one_it_cannot_hash():
    """The same module and sample layout again: no new trace; a module with an unhashable field: built all the same."""
    from flax import linen as nn

    traces = []

    class Counted(nn.Module):
        width: int
        extra: tuple | list = ()

        @nn.compact
        def __call__(self, x):
            traces.append(x.shape)  # runs once per trace, never when a compiled program runs
            return nn.Dense(self.width)(x)

    x = np.ones((2, 4), np.float32)
    a, b = (TrainState.from_linen(Counted(3), x, optax.sgd(0.1), seed=s) for s in (0, 1))
    assert traces == [(2, 4)]  # one trace, two seeds: the key is an argument of the program
    assert not np.allclose(a.params["Dense_0"]["kernel"], b.params["Dense_0"]["kernel"])
    TrainState.from_linen(Counted(5), x, optax.sgd(0.1))  # another module: its own program
    TrainState.from_linen(Counted(3), np.ones((3, 4), np.float32), optax.sgd(0.1))  # another shape: traced again
    assert traces == [(2, 4), (2, 4), (3, 4)]
    for _ in range(2):
        c = TrainState.from_linen(Counted(3, extra=[1]), x, optax.sgd(0.1))  # a list field: no hash, no cache
    assert traces == [(2, 4), (2, 4), (3, 4), (2, 4), (2, 4)]
    np.testing.assert_array_equal(c.params["Dense_0"]["kernel"], a.params["Dense_0"]["kernel"])


def test_from_nnx_splits_params_and_state_and_merges_back():
    """An NNX module splits into graphdef, params and the rest, and to_nnx() rebuilds it."""
    model = NNXNet(nnx.Rngs(0))
    state = TrainState.from_nnx(model, optax.adam(1e-3))
    assert sorted(state.params) == ["bn", "dense1", "dense2"]
    assert sorted(state.params["bn"]) == ["bias", "scale"]
    assert "mean" in state.model_state["bn"]
    rebuilt = state.to_nnx()
    x = jnp.ones((2, 4))
    model.eval()
    rebuilt.eval()
    np.testing.assert_allclose(rebuilt(x), model(x))


def test_plain_state_and_apply_gradients():
    """A plain-function state applies optimizer updates and counts steps."""
    state = TrainState.create(lambda p, x: x @ p["w"], {"w": jnp.ones((2,))}, optax.sgd(0.5), seed=0)
    state = state.apply_gradients({"w": jnp.array([1.0, -1.0])})
    assert int(state.step) == 1
    np.testing.assert_allclose(state.params["w"], [0.5, 1.5])


def test_train_state_is_a_pytree_that_jit_accepts_and_donates():
    """TrainState passes through jit (static apply_fn and tx) and can be donated."""
    state = TrainState.from_linen(LinenNet(), jnp.ones((2, 4)), optax.sgd(0.1))
    bump = jax.jit(lambda s: s.replace(step=s.step + 1), donate_argnums=0)
    assert int(bump(state).step) == 1
    leaves = jax.tree.leaves(state)
    assert all(isinstance(x, jax.Array) for x in leaves)


def test_bad_arguments_are_rejected_with_clear_errors():
    """Wrong optimizer, seed, module or rngs types fail at construction, naming the argument."""
    with pytest.raises(TypeError, match=r"`tx` must be an optax.GradientTransformation .* got 0.1"):
        TrainState.create(lambda p, x: x, jnp.ones(1), 0.1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`seed` must be an int, got str 'a'"):
        TrainState.create(lambda p, x: x, jnp.ones(1), optax.sgd(0.1), seed="a")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`module` must be a flax.linen.Module, got NNXNet"):
        TrainState.from_linen(NNXNet(nnx.Rngs(0)), jnp.ones((1, 4)), optax.sgd(0.1))  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"`rngs` must be a sequence of stream names such as \('dropout',\), got 'dropout'"
    ):
        TrainState.from_linen(LinenNet(), jnp.ones((1, 4)), optax.sgd(0.1), rngs="dropout")
    with pytest.raises(TypeError, match=r"`model` must be an nnx.Module or a function building one, got LinenNet\."):
        TrainState.from_nnx(LinenNet(), optax.sgd(0.1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"to_nnx\(\) needs a state built with TrainState.from_nnx"):
        TrainState.create(lambda p, x: x, jnp.ones(1), optax.sgd(0.1)).to_nnx()


def test_from_nnx_takes_a_function_that_builds_the_module():
    """``from_nnx(lambda: Model(...), tx)`` builds it; a function returning something else is named."""
    state = TrainState.from_nnx(lambda: nnx.Linear(3, 2, rngs=nnx.Rngs(0)), optax.sgd(0.1))
    assert sorted(state.params) == ["bias", "kernel"]
    assert state.partitioning == ()
    with pytest.raises(TypeError, match=r"`model\(\)` must build a flax.nnx.Module, got int\."):
        TrainState.from_nnx(lambda: 3, optax.sgd(0.1))


def test_linen_partition_annotations_are_recorded_and_unboxed():
    """``nn.with_logical_partitioning`` names land in ``partitioning``; the params are plain arrays."""
    from flax import linen as nn

    dense = nn.Dense(4, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")))
    state = TrainState.from_linen(dense, np.ones((1, 3), np.float32), optax.adam(1e-3))
    assert state.partitioning == (("kernel", ("embed", "mlp")),)
    assert type(state.params["kernel"]).__name__ == "ArrayImpl"
    assert sorted(state.params) == ["bias", "kernel"]


def _flax_state(model, tx, x, **fields):
    """A ``flax.training.train_state.TrainState`` as Flax's own examples build it."""
    from flax.training import train_state

    variables = model.init(jax.random.PRNGKey(0), x)

    class WithStats(train_state.TrainState):
        batch_stats: object = None

    return WithStats.create(apply_fn=model.apply, params=variables["params"], tx=tx, **fields)


def test_a_flax_train_state_trains_as_flaxs_own_loop_does():
    """create_trainer takes Flax's TrainState: the same parameters as its apply_gradients loop, step carried on."""
    from flax import linen as nn

    from ember.training import create_trainer

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(1)(nn.relu(nn.Dense(8)(x)))

    model = MLP()
    x, y = jnp.linspace(-1, 1, 24).reshape(8, 3), jnp.arange(8.0).reshape(8, 1)
    flax_state = _flax_state(model, optax.sgd(0.05, momentum=0.9), x)

    def mse(params):
        return jnp.mean((flax_state.apply_fn({"params": params}, x) - y) ** 2)

    flax_state = flax_state.apply_gradients(grads=jax.grad(mse)(flax_state.params))  # one step before handing over
    hand = flax_state
    for _ in range(4):
        hand = hand.apply_gradients(grads=jax.grad(mse)(hand.params))
    trainer = create_trainer(flax_state, lambda model, batch: jnp.mean((model(batch[0]) - batch[1]) ** 2))
    trained = trainer.run([(x, y)] * 4).train_state
    assert int(trained.step) == int(hand.step) == 5
    for ours, theirs in zip(jax.tree.leaves(trained.params), jax.tree.leaves(hand.params), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


def test_a_flax_train_state_with_batch_stats_updates_them_in_training_mode():
    """A ``batch_stats`` field becomes model_state; the module's ``train`` flag is passed."""
    from flax import linen as nn

    from ember.training import TrainState

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            return nn.Dense(1)(nn.BatchNorm(use_running_average=not train)(x))

    x = jnp.arange(12.0).reshape(4, 3)
    variables = Net().init(jax.random.PRNGKey(0), x)
    flax_state = _flax_state(Net(), optax.sgd(0.1), x, batch_stats=variables["batch_stats"])
    state = TrainState.from_flax(flax_state)
    assert sorted(state.model_state) == ["batch_stats"]
    _, updated = state.apply_fn(state.params, state.model_state, None, True, x)
    np.testing.assert_allclose(
        updated["batch_stats"]["BatchNorm_0"]["mean"], 0.01 * x.mean(axis=0), rtol=1e-6
    )  # momentum 0.99


def test_a_state_of_another_kind_is_named_with_its_module():
    """Two classes called TrainState are told apart in the error."""
    from ember.training import create_evaluator, create_trainer

    look_alike = type("TrainState", (), {"__module__": "mylib.states"})  # neither kind, named as both are
    expected = (
        "`state` must be an ember.training.TrainState or a flax.training.train_state.TrainState, or a function "
        "of the first batch returning one, got mylib.states.TrainState."
    )
    with pytest.raises(TypeError, match=re.escape(expected)):
        create_trainer(look_alike(), lambda model, batch: 0.0)
    expected = (
        "`source` must be an ember.training.TrainState or a flax.training.train_state.TrainState, or a trainer "
        "Engine, got mylib.states.TrainState."
    )
    with pytest.raises(TypeError, match=re.escape(expected)):
        create_evaluator(look_alike(), lambda model, batch: 0.0)
