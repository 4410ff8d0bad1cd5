import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from ember import Engine, Events
from ember.data import ArrayDataset
from ember.metrics import RunningAverage
from ember.training import SingleDevice, TrainState, create_evaluator, create_trainer
from tests.training.models import LinenNet, batches, classification_loss


def linear_state():
    return TrainState.create(
        lambda p, x: x @ p["w"] + p["b"], {"w": jnp.zeros((4, 3)), "b": jnp.zeros(3)}, optax.adam(0.05)
    )


def linen_state():
    return TrainState.from_linen(LinenNet(), jnp.ones((2, 4)), optax.adam(1e-2), rngs=("dropout",))


def test_trainer_runs_the_step_and_keeps_outputs_on_device():
    """Each iteration updates state.train_state; state.output holds the step's device arrays."""
    trainer = create_trainer(linen_state(), classification_loss, placement=SingleDevice())
    outputs = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: outputs.append(e.state.output))
    state = trainer.run(batches(6), max_epochs=2)
    assert int(state.train_state.step) == 12
    assert all(isinstance(o["loss"], jax.Array) for o in outputs)
    assert outputs[-1]["logits"].shape == (16, 3)
    assert float(outputs[-1]["loss"]) < float(outputs[0]["loss"])


def test_k_steps_per_call_gives_the_same_parameters_and_per_step_outputs():
    """steps_per_call=10 fires the iteration events once per step and trains exactly like K=1."""
    data = batches(23)  # two groups of 10 and a trailing group of 3 per epoch
    results = {}
    for k in (1, 10):
        trainer = create_trainer(linen_state(), classification_loss, steps_per_call=k, placement=SingleDevice())
        losses = []
        trainer.add_event_handler(
            Events.ITERATION_COMPLETED, lambda e, losses=losses: losses.append(e.state.output["loss"])
        )
        state = trainer.run(data, max_epochs=2)
        results[k] = (state, [float(x) for x in losses])
    (s1, l1), (s10, l10) = results[1], results[10]
    assert len(l1) == len(l10) == 46
    np.testing.assert_allclose(l10, l1, rtol=1e-5)
    assert int(s10.train_state.step) == 46
    np.testing.assert_allclose(
        s10.train_state.params["Dense_0"]["kernel"], s1.train_state.params["Dense_0"]["kernel"], rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("k", [1, 3])
def test_device_prefetch_trains_like_direct_feeding(k):
    """prefetch=2 (device_put ahead) and prefetch=0 (straight into the call) train alike."""
    params = []
    for prefetch in (0, 2):
        trainer = create_trainer(linear_state(), classification_loss, steps_per_call=k, prefetch=prefetch)
        params.append(trainer.run(batches(7), max_epochs=2).train_state.params["w"])
        assert trainer.state.iteration == 14
    np.testing.assert_array_equal(params[0], params[1])


@pytest.mark.parametrize("k", [1, 2])
def test_default_prefetch_puts_only_large_batches_ahead_on_an_accelerator(k, monkeypatch):
    """prefetch=None: small batches go straight into the call; from 1.5 MiB per call they are put ahead.

    The placement is told it runs on an accelerator; the CPU backend computes as usual.
    """
    from ember.training import _auto_prefetch as _trainer

    monkeypatch.setattr(SingleDevice, "prefers_prefetch", property(lambda self: True))
    rows = -(-_trainer.PREFETCH_MIN_BYTES // (20 * k))  # 20 bytes a row (4 float32 features, an int32 label)
    for n, ahead in ((rows - 1, False), (rows, True)):  # just under the threshold a call, and just over
        calls: list[str] = []
        placement = SingleDevice()
        for name in ("prepare_batch", "put_batch"):
            original = getattr(placement, name)
            monkeypatch.setattr(placement, name, lambda b, o=original, n=name, c=calls, **kw: c.append(n) or o(b, **kw))
        data = [{"x": np.ones((n, 4), np.float32), "y": np.zeros(n, np.int32)}] * 4
        trainer = create_trainer(linear_state(), classification_loss, placement=placement, steps_per_call=k)
        trainer.run(data)
        assert trainer.state.iteration == 4
        assert ("put_batch" in calls) is ahead, (n, calls)
    small = {"x": np.ones((2, 4), np.float32)}
    assert _trainer.auto_prefetch(small, SingleDevice()) == 0
    big_on_device = {"x": jnp.ones((rows * k, 4))}  # already on device: nothing to transfer
    assert _trainer.auto_prefetch(big_on_device, SingleDevice()) == 0


def test_any_reiterable_of_numpy_pytrees_feeds_the_trainer():
    """A loader-like object without a length (a fresh generator per pass) trains like the same list."""

    class Loader:
        def __iter__(self):
            yield from batches(5)

    from_list = create_trainer(linear_state(), classification_loss).run(batches(5), max_epochs=2)
    from_loader = create_trainer(linear_state(), classification_loss).run(Loader(), max_epochs=2)
    assert from_loader.epoch_length == 5
    assert from_loader.iteration == 10
    np.testing.assert_array_equal(from_loader.train_state.params["w"], from_list.train_state.params["w"])


def test_k_step_outputs_are_read_lazily_per_step():
    """With steps_per_call>1 each step's output is a StepOutput whose values are that step's."""
    trainer = create_trainer(linear_state(), classification_loss, steps_per_call=4)
    seen = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(e.state.output))
    trainer.run(batches(6))
    assert [type(o).__name__ for o in seen] == ["StepOutput"] * 6
    assert sorted(seen[0]) == ["logits", "loss"]
    assert dict(seen[5])["logits"].shape == (16, 3)
    assert len({float(o["loss"]) for o in seen}) == 6


def test_terminate_with_k_steps_takes_effect_at_the_group_boundary():
    """terminate() in the middle of a 5-step group stops after the group, keeping counters and state in step."""
    trainer = create_trainer(linear_state(), classification_loss, steps_per_call=5)
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=7), lambda e: e.terminate())
    state = trainer.run(batches(12), max_epochs=1)
    assert state.iteration == 10
    assert int(state.train_state.step) == 10


def test_a_batch_that_differs_from_the_first_is_refused_showing_both():
    """A later batch with another shape gets an error naming both structures, before XLA sees it."""
    data = batches(2)
    data.append({"x": np.zeros((16, 5), np.float32), "y": data[0]["y"]})
    trainer = create_trainer(linear_state(), classification_loss)
    with pytest.raises(ValueError, match=r"(?s)differs from the first one.*float32\[16, 4\].*float32\[16, 5\]"):
        trainer.run(data)
    assert trainer.state.iteration == 3


@pytest.mark.parametrize("where", [1, 4])
def test_k_step_groups_refuse_a_differing_batch_clearly(where):
    """With steps_per_call=3 a differing batch inside the first group or in a later one gets the same error."""
    data = batches(6)
    data[where] = {"x": np.zeros((16, 5), np.float32), "y": data[0]["y"]}
    trainer = create_trainer(linear_state(), classification_loss, steps_per_call=3)
    with pytest.raises(ValueError, match=r"(?s)differs from the first one.*float32\[16, 4\].*float32\[16, 5\]"):
        trainer.run(data)


def test_the_trainer_never_pulls_values_to_the_host():
    """Many iterations under the transfer guard, bare and with an every=N handler that reads when it fires."""
    trainer = create_trainer(linear_state(), classification_loss, placement=SingleDevice())
    data = batches(8)
    trainer.run(data[:1])  # compile outside the guard
    read = []
    with jax.transfer_guard_device_to_host("disallow"):
        trainer.state.max_epochs = None
        trainer.run(data, max_epochs=5)
    handle = trainer.add_event_handler(Events.ITERATION_COMPLETED(every=20), lambda e: read.append(e.state.iteration))
    with jax.transfer_guard_device_to_host("disallow"):
        trainer.state.max_epochs = None
        trainer.run(data, max_epochs=5)
    handle.remove()
    assert read == [20, 40]


def test_debug_runs_the_step_uncompiled():
    """debug=True gives the same result as the compiled step."""
    results = []
    for debug in (False, True):
        trainer = create_trainer(linear_state(), classification_loss, debug=debug, placement=SingleDevice())
        results.append(trainer.run(batches(3)).train_state.params["w"])
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6)


def test_lazy_state_is_built_from_the_first_batch():
    """A state factory receives the first (host) batch, as Ignite-style trainers init from data."""
    seen = []

    def build(batch):
        seen.append(batch["x"].shape)
        return TrainState.from_linen(LinenNet(), batch["x"], optax.sgd(0.1), rngs=("dropout",))

    trainer = create_trainer(build, classification_loss)
    assert trainer.state.train_state is None
    trainer.run(batches(2))
    assert seen == [(16, 4)]
    assert int(trainer.state.train_state.step) == 2


def test_one_evaluator_runs_on_data_of_different_batch_sizes():
    """Ignite's mnist.py: the train loader in 64s, the validation loader in 1000s; each run compiles for its shape."""
    from ember.metrics import Accuracy

    trainer = create_trainer(linear_state(), classification_loss)
    trainer.run(batches(2))
    evaluator = create_evaluator(trainer, lambda model, b: {"logits": model(b["x"]), "y": b["y"]})
    Accuracy(output_transform=lambda o: [o["logits"], o["y"]]).attach(evaluator, "accuracy")
    examples = {k: np.concatenate([b[k] for b in batches(4)]) for k in ("x", "y")}  # 64 examples
    small = [{k: v[i : i + 16] for k, v in examples.items()} for i in range(0, 64, 16)]
    whole = [examples]
    accuracies = [evaluator.run(data).metrics["accuracy"] for data in (small, whole, small)]
    assert accuracies[0] == accuracies[1] == accuracies[2]
    within_one_run = [small[0], {k: v[:32] for k, v in examples.items()}]
    with pytest.raises(ValueError, match=r"(?s)differs from the first one.*float32\[16, 4\].*float32\[32, 4\]"):
        evaluator.run(within_one_run)


def test_evaluator_follows_the_trainer_state_and_accepts_a_short_last_batch():
    """An evaluator built on a trainer uses its current train state; a short last batch is fine."""
    trainer = create_trainer(linear_state(), classification_loss)
    evaluator = create_evaluator(trainer, lambda model, b: model(b["x"]))
    data = [*batches(2), {k: v[:5] for k, v in batches(1)[0].items()}]
    trainer.run(batches(3))
    out = evaluator.run(data).output
    assert out.shape == (5, 3)
    expected = data[-1]["x"] @ trainer.state.train_state.params["w"] + trainer.state.train_state.params["b"]
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_resume_from_a_state_dict_with_array_dataset_is_exact():
    """Training 7 steps, saving, restoring and training the rest equals training straight through."""
    arrays = {"x": np.concatenate([b["x"] for b in batches(4)]), "y": np.concatenate([b["y"] for b in batches(4)])}

    def fresh():
        return ArrayDataset(arrays, batch_size=16, shuffle=True, seed=7)

    straight = create_trainer(linear_state(), classification_loss)
    straight.run(fresh(), max_epochs=3)

    first = create_trainer(linear_state(), classification_loss)
    first.add_event_handler(Events.ITERATION_COMPLETED(once=7), lambda e: e.interrupt())
    first.run(fresh(), max_epochs=3)
    saved_engine, saved_state = first.state_dict(), jax.device_get(first.state.train_state)

    second = create_trainer(saved_state, classification_loss)
    second.load_state_dict(saved_engine)
    second.run(fresh())
    assert second.state.iteration == 12
    np.testing.assert_array_equal(second.state.train_state.params["w"], straight.state.train_state.params["w"])


def test_trainer_option_errors():
    """Bad trainer options fail at creation, naming the option."""
    with pytest.raises(ValueError, match=r"`steps_per_call` must be an int >= 1, got 0"):
        create_trainer(linear_state(), classification_loss, steps_per_call=0)
    with pytest.raises(ValueError, match=r"`prefetch` must be an int >= 0, got -1"):
        create_trainer(linear_state(), classification_loss, prefetch=-1)
    with pytest.raises(
        TypeError,
        match=re.escape(
            "`placement` must be a Placement (SingleDevice(), DataParallel(), Pmap(), Sharded(...)), got 'gpu'."
        ),
    ):
        create_trainer(linear_state(), classification_loss, placement="gpu")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`state` must be an ember.training.TrainState .*, got builtins.int\."):
        create_trainer(3, classification_loss)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`source` must be .*, or a trainer Engine, got builtins.int\."):
        create_evaluator(3, lambda m, b: m(b))  # type: ignore[arg-type]
    assert isinstance(create_evaluator(Engine(lambda e, b: b), lambda m, b: m(b)), Engine)


def test_the_given_state_is_donated_and_a_copy_keeps_it():
    """As documented: the state passed in is donated to the step; a copy of it survives the run."""

    def make():
        return TrainState.create(lambda p, x: x * p, jnp.ones(2), optax.sgd(0.1))

    given, kept = make(), make()
    create_trainer(given, lambda m, b: jnp.mean(m(b) ** 2)).run([jnp.ones(2)] * 2)
    trainer = create_trainer(jax.tree.map(jnp.copy, kept), lambda m, b: jnp.mean(m(b) ** 2))
    trainer.run([jnp.ones(2)] * 2)
    with pytest.raises(RuntimeError, match="Array has been deleted"):
        given.params + 1
    assert kept.params.tolist() == [1.0, 1.0]
    assert trainer.state.train_state.params.tolist() == pytest.approx([0.81, 0.81])


def test_steps_per_call_compiles_nothing_after_the_first_epoch(fresh_compilations):
    """K steps per call over epochs with a short last group: every compilation happens in epoch 1."""
    from flax import linen as nn
    from jax import monitoring

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            x = nn.relu(nn.Conv(4, (3, 3))(x))
            return nn.Dense(3)(x.reshape(x.shape[0], -1))

    rng = np.random.default_rng(0)
    data = ArrayDataset(
        {"x": rng.normal(size=(80, 6, 6, 1)).astype(np.float32), "y": rng.integers(0, 3, 80).astype(np.int32)},
        batch_size=8,
        shuffle=True,
        drop_remainder=True,
    )  # 10 batches: groups of 4, 4 and 2
    state = TrainState.from_linen(CNN(), np.zeros((1, 6, 6, 1), np.float32), optax.sgd(0.1))
    trainer = create_trainer(state, classification_loss, steps_per_call=4)
    compiled_in: list[int] = []

    def count(name, _secs, **_):
        if name.endswith("backend_compile_duration"):
            compiled_in.append(trainer.state.epoch)

    monitoring.register_event_duration_secs_listener(count)
    try:
        trainer.run(data, max_epochs=3)
    finally:
        monitoring.unregister_event_duration_listener(count)
    assert compiled_in  # the step (groups of 4 and of 2) was compiled
    assert set(compiled_in) == {1}


def test_k_steps_are_unrolled_on_cpu_only_for_steps_with_convolutions():
    """The K-step loop is unrolled on the CPU backend only where the step convolves (inside jit and grad too)."""
    from flax import linen as nn

    from ember.training import Pmap, make_train_step
    from ember.training._process import _convolves

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(nn.Conv(4, (3, 3))(x).reshape(x.shape[0], -1))

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(x.reshape(x.shape[0], -1))

    group = np.ones((2, 4, 8, 8, 1), np.float32)  # K=2 steps of 4 images
    found = {}
    for model in (CNN(), MLP()):
        state = TrainState.from_linen(model, group[0], optax.sgd(0.1))
        step = make_train_step(lambda m, b: jnp.mean(m(b) ** 2))
        found[type(model).__name__] = _convolves(step, SingleDevice(), state, group)
    pmap_step = make_train_step(lambda m, b: jnp.mean(m(b) ** 2), axis_name="batch")
    state = TrainState.from_linen(CNN(), group[0], optax.sgd(0.1))
    found["CNN under pmap"] = _convolves(pmap_step, Pmap(), state, group[None])  # (devices, K, B/n, ...)
    assert found == {"CNN": True, "MLP": False, "CNN under pmap": True}


def test_a_k_step_trainer_traces_the_users_step_once():
    """Deciding whether to unroll traces the K-step loop as its compilation does, which reuses that trace."""
    traces = []

    def loss_fn(model, batch):
        traces.append(batch.shape)
        return jnp.mean((model(batch) - 1.0) ** 2)

    state = TrainState.create(lambda p, x: x * p, jnp.zeros(()), optax.sgd(0.1))  # as a model's: not weakly typed
    trainer = create_trainer(state, loss_fn, steps_per_call=2)
    RunningAverage(output_transform=lambda out: out["loss"]).attach(trainer, "loss")  # a fused carry too
    trainer.run([np.ones(2, np.float32)] * 4, max_epochs=2)
    assert traces == [(2,)]


class CallTimeRngs(nnx.Module):
    """As Flax's own NNX examples now write it: Dropout built without rngs, ``rngs`` passed at call time."""

    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(4, 3, rngs=rngs)
        self.dropout = nnx.Dropout(0.5)

    def __call__(self, x, rngs: nnx.Rngs | None = None):
        return self.dropout(self.linear(x), rngs=rngs)


def test_an_nnx_model_taking_rngs_at_call_time_gets_a_stream_of_the_steps_key():
    """Training passes rngs (dropout is on, reproducibly, anew each step); evaluation needs none."""
    x = np.ones((8, 4), np.float32)

    def run():
        trainer = create_trainer(
            TrainState.from_nnx(CallTimeRngs(nnx.Rngs(0)), optax.sgd(0.1)),
            lambda model, b: (jnp.mean(model(b) ** 2), {"y": model(b)}),
        )
        outputs = []
        trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: outputs.append(np.asarray(e.state.output["y"])))
        trainer.run([x, x])
        return trainer, outputs

    trainer, first = run()
    _, again = run()
    np.testing.assert_array_equal(first[0], again[0])  # the same keys: the same masks
    assert (first[0] == 0).any()  # dropped
    assert not np.array_equal(first[0] == 0, first[1] == 0)  # a new mask each step
    out = create_evaluator(trainer, lambda model, b: model(b)).run([x]).output
    assert not (np.asarray(out) == 0).any()  # evaluation: dropout off, no rngs needed


def test_an_evaluator_counts_only_the_real_examples_of_masked_batches_and_a_trainer_refuses_them():
    """Masked batches (an evaluation set's parts): the metric of the real examples; a trainer names drop_remainder."""
    import numpy as np

    from ember.data import Masked
    from ember.metrics import Average

    state = TrainState.create(lambda p, x: x * p, jnp.array(1.0), optax.sgd(0.1))
    evaluator = create_evaluator(state, lambda model, b: {"value": model(b)})
    Average(key="value").attach(evaluator, "mean")
    data = [Masked(np.array([1.0, 2.0, 2.0], np.float32), np.array([True, True, False]))]
    assert evaluator.run(data).metrics["mean"] == 1.5
    trainer = create_trainer(state, lambda m, b: jnp.mean(m(b) ** 2))
    with pytest.raises(TypeError, match=re.escape("build the training data with drop_remainder=True")):
        trainer.run(data)


def test_a_k_step_trainer_donates_its_state_and_an_evaluator_reads_without_donating():
    """steps_per_call=2 donates the given state too; an evaluator of the trainer leaves its state alive."""
    state = TrainState.create(lambda p, x: x * p, jnp.ones(2), optax.sgd(0.1))
    trainer = create_trainer(state, lambda m, b: jnp.mean(m(b) ** 2), steps_per_call=2)
    trainer.run([jnp.ones(2)] * 4)
    assert state.params.is_deleted()
    before = trainer.state.train_state
    evaluator = create_evaluator(trainer, lambda m, b: {"y": m(b)})
    evaluator.run([jnp.ones(2)] * 3)
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(before))
    assert trainer.state.train_state is before
