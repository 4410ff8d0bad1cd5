import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ember import Events
from ember.metrics import Accuracy, Average, Precision, RunningAverage, Sum
from ember.training import Pmap, TrainState, create_evaluator, create_trainer
from tests.training.models import batches


def loss_fn(model, batch):
    logits = model(batch["x"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    return loss, {"y_pred": logits, "y": batch["y"]}


def state():
    return TrainState.create(lambda p, x: x @ p["w"], {"w": jnp.zeros((4, 3))}, optax.adam(0.05))


def metrics():
    return {
        "loss": Average(key="loss"),
        "accuracy": Accuracy(),
        "precision": Precision(num_classes=3),
        "running": RunningAverage(output_transform=lambda out: out["loss"]),
    }


def run(k, fuse):
    trainer = create_trainer(state(), loss_fn, steps_per_call=k)
    trainer.can_fuse = fuse
    attached = metrics()
    for name, m in attached.items():
        m.attach(trainer, name)
    seen, running = [], []
    trainer.add_event_handler(
        Events.EPOCH_COMPLETED, lambda e: seen.append({k: float(v) for k, v in e.state.metrics.items()})
    )
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: running.append(float(e.state.metrics["running"])))
    trainer.run(batches(7), max_epochs=2)
    return trainer, seen, running


@pytest.mark.parametrize("k", [1, 3])
def test_fused_metrics_equal_handler_metrics(k):
    """Metrics folded into the compiled step give the handler path's values (counts exactly, floats to rounding)."""
    fused_trainer, fused, fused_running = run(k, fuse=True)
    plain_trainer, plain, plain_running = run(k, fuse=False)
    assert len(fused) == len(plain) == 2
    for got, want in zip(fused, plain, strict=True):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-7)
        assert got["accuracy"] == want["accuracy"]
    assert len(plain_trainer._fusion.metrics) == 0
    # with K steps per call the RunningAverage folds in too: each iteration reads its own step's value
    assert len(fused_trainer._fusion.metrics) == 4
    assert len(fused_running) == len(plain_running) == 14
    assert fused_running == pytest.approx(plain_running, rel=1e-6)
    assert len(set(fused_running)) == 14  # a new value at every iteration, not one per K-step call


def test_evaluator_folds_metrics_in_and_detach_takes_them_out():
    """An evaluator's fused Accuracy equals the handler path; detaching recompiles without it."""
    values = []
    for fuse in (True, False):
        evaluator = create_evaluator(state(), lambda model, b: {"y_pred": model(b["x"]) + b["x"][:, :3], "y": b["y"]})
        evaluator.can_fuse = fuse
        acc = Accuracy()
        acc.attach(evaluator, "accuracy")
        values.append(evaluator.run(batches(3)).metrics["accuracy"])
        acc.detach(evaluator)
        assert evaluator._fusion.metrics == []
        assert evaluator.run(batches(3)).metrics == {}
    assert values[0] == values[1]
    assert 0.0 < values[0] < 1.0


def test_pmap_and_debug_keep_the_handler_path():
    """Under pmap or debug=True metrics are updated by handlers (nothing folds into the step)."""
    for kwargs in ({"placement": Pmap()}, {"debug": True}):
        trainer = create_trainer(state(), loss_fn, **kwargs)
        Accuracy().attach(trainer, "accuracy")
        assert trainer._fusion.metrics == []
        assert 0.0 <= trainer.run(batches(2)).metrics["accuracy"] <= 1.0
    np.testing.assert_equal(Precision().fusable, False)


def test_fused_state_is_read_from_the_carry_and_moves_between_engines():
    """A fused metric's state, update count and reset follow the compiled step, per engine, exactly."""
    total = Sum(output_transform=lambda out: out["y"])  # the labels: exact integer sums
    first, second = create_trainer(state(), loss_fn), create_trainer(state(), loss_fn)
    seen = []
    total.attach(first, "total", usage="running")
    first.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(int(total.state)))
    data = batches(4)
    first.run(data)
    want = np.cumsum([int(np.sum(b["y"])) for b in data]).tolist()
    assert seen == want
    assert total._updates == 4
    assert total._carry is not None
    total.reset()  # leaves the carry: the next call of `first` packs again
    assert total._carry is None
    assert float(total.state) == 0.0
    with pytest.raises(RuntimeError, match="computed before any update"):
        total.compute()
    total.attach(second, "total", usage="running")
    second.run(data[:2])  # the running usage resets at STARTED
    assert total.compute() == want[1]
    assert total._updates == 2
    first.run(data[:1])  # `first` takes the metric back into its own carry
    assert total.compute() == want[0]
    assert total._updates == 1


def test_k_step_running_average_reads_nothing_back_per_iteration(monkeypatch):
    """With K=3 the fused running average publishes device values; the only host reads are epoch computes."""
    import ember.metrics._metric as metric_module
    from ember.training._fused import Carry

    trainer = create_trainer(state(), loss_fn, steps_per_call=3)
    RunningAverage(output_transform=lambda out: out["loss"]).attach(trainer, "running")
    Accuracy().attach(trainer, "accuracy")
    published = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: published.append(e.state.metrics["running"]))
    reads, unpacks = [], []
    to_host, read = metric_module._to_host, Carry.read
    monkeypatch.setattr(metric_module, "_to_host", lambda v: (reads.append(trainer.last_event_name), to_host(v))[1])
    monkeypatch.setattr(Carry, "read", lambda self, i: (unpacks.append(i), read(self, i))[1])
    trainer.run(batches(6), max_epochs=2)
    assert reads == [Events.EPOCH_COMPLETED, Events.EPOCH_COMPLETED]  # Accuracy's compute, once per epoch
    # on device, no host read: Accuracy's state for its computes, and the running average's once, when
    # Accuracy's reset at the second EPOCH_STARTED has the next call pack every state again
    assert unpacks == [1, 0, 1]
    assert len(published) == 12
    assert all(isinstance(v, jax.Array) and v.shape == () for v in published)


def test_published_value_reuses_its_buffer_unless_something_else_holds_it(monkeypatch):
    """K=1 as on GPU: the step writes the running average into the last value's buffer; kept values stay valid."""
    import ember.training._fused as fused_module

    batches_of_spares = []
    copies = fused_module._copies
    monkeypatch.setattr(fused_module, "_copies", lambda v: (batches_of_spares.append(1), copies(v))[1])
    trainer = create_trainer(state(), loss_fn)
    trainer._fusion.reuse_published = True  # the default on GPU only
    RunningAverage(output_transform=lambda out: out["loss"]).attach(trainer, "running")
    Average(key="loss").attach(trainer, "loss")
    pointers, values, kept = [], [], []

    @trainer.on(Events.ITERATION_COMPLETED)
    def record(engine):
        pointers.append(engine.state.metrics["running"].unsafe_buffer_pointer())
        values.append(float(engine.state.metrics["running"]))
        if engine.state.iteration in (3, 5):
            kept.append(engine.state.metrics["running"])  # a reference outside state.metrics
        if engine.state.iteration == 6:
            engine.state.metrics["copy"] = engine.state.metrics["running"]  # another name counts as outside

    trainer.run(batches(8))
    new_buffer = [i + 1 for i in range(1, 8) if pointers[i] != pointers[i - 1]]
    assert new_buffer == [4, 6, 7]  # only the calls after a value was kept elsewhere
    assert len(batches_of_spares) == 1  # their fresh buffers came from one dispatch
    assert [float(v) for v in kept] == [values[2], values[4]]
    assert float(trainer.state.metrics["copy"]) == values[5]
    assert len(set(values)) == 8


def test_published_values_are_fresh_outputs_on_cpu():
    """On CPU (and with K steps per call) the published value is an output of its own, not carried."""
    trainer = create_trainer(state(), loss_fn)
    RunningAverage(output_transform=lambda out: out["loss"]).attach(trainer, "running")
    seen = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(e.state.metrics["running"]))
    trainer.run(batches(3))
    assert trainer._fusion._carry.donor == ()
    assert len({v.unsafe_buffer_pointer() for v in seen}) == 3  # all kept, all distinct and valid
    assert all(not v.is_deleted() for v in seen)


def test_unshared_counts_every_holder_of_a_published_value():
    """Donation needs the value, its inner nodes and leaves held by the carry and ``state.metrics`` alone."""
    from ember.training._fused import _unshared

    donor = (jnp.float32(1.0), {"a": jnp.float32(2.0), "b": (jnp.float32(3.0),)}, None)
    assert _unshared(donor, 0, {}, ())
    assert _unshared(donor, 1, {}, ())
    assert _unshared(donor, 2, {}, ())  # nothing to donate
    metrics = {"running": donor[0]}
    assert not _unshared(donor, 0, {}, ())  # the dict entry is a holder the call was not told about
    assert _unshared(donor, 0, metrics, ["running"])  # the engine's own entry
    assert not _unshared(donor, 0, metrics, ["other"])  # an entry under a name the metric does not use
    metrics["copy"] = metrics["running"]
    assert not _unshared(donor, 0, metrics, ["running"])  # and a second name of the user's
    for holder in (lambda d: d["a"], lambda d: d["b"], lambda d: d["b"][0], lambda d: d):
        kept = holder(donor[1])
        assert not _unshared(donor, 1, {}, ())  # a leaf, an inner node or the value held elsewhere
        del kept
    assert _unshared(donor, 1, {}, ())


def test_the_fused_step_compiles_once_however_often_the_metrics_reset(caplog):
    """The packed accumulators are placed like the train state, so later calls do not compile the step again."""
    state = TrainState.create(lambda p, x: x @ p, jnp.zeros((3, 2)), optax.sgd(0.1))
    trainer = create_trainer(state, lambda m, b: jnp.mean(m(b) ** 2))
    RunningAverage(output_transform=lambda o: o["loss"]).attach(trainer, "running")
    Average(output_transform=lambda o: o["loss"]).attach(trainer, "epoch_loss")  # reset every epoch
    with jax.log_compiles(True), caplog.at_level(logging.WARNING, logger="jax"):
        trainer.run([jnp.ones((4, 3))] * 3, max_epochs=3)
    compiled = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("Finished XLA compilation of jit(fused)")
    ]
    assert len(compiled) == 1, compiled
