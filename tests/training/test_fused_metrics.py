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
        "precision": Precision(num_classes=3, average=True),
        "running": RunningAverage(output_transform=lambda out: out["loss"]),
    }


def run(k, debug=False):
    """Train with every metric attached; ``debug=True`` is the reference: an uncompiled step, metrics by handlers."""
    trainer = create_trainer(state(), loss_fn, steps_per_call=k, debug=debug)
    attached = metrics()
    for name, m in attached.items():
        m.attach(trainer, name)
    seen, running = [], []
    trainer.add_event_handler(
        Events.EPOCH_COMPLETED, lambda e: seen.append({k: float(v) for k, v in e.state.metrics.items()})
    )
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: running.append(float(e.state.metrics["running"])))
    trainer.run(batches(7), max_epochs=2)
    return seen, running


def handler_updates(monkeypatch):
    """The metrics that ``Metric.update`` (the handler path) is called on, by class name."""
    from ember.metrics import Metric

    names = []
    update = Metric.update
    monkeypatch.setattr(Metric, "update", lambda self, out: (names.append(type(self).__name__), update(self, out))[1])
    return names


@pytest.mark.parametrize("k", [1, 3])
def test_fused_metrics_equal_handler_metrics(k, monkeypatch):
    """Metrics run inside the compiled step give the handler path's values (counts exactly, floats to rounding)."""
    updated = handler_updates(monkeypatch)
    fused, fused_running = run(k)
    assert updated == []  # every metric, the running average included with K steps per call, ran in the step
    plain, plain_running = run(k, debug=True)
    assert set(updated) == {"Average", "Accuracy", "Precision", "RunningAverage"}
    assert len(fused) == len(plain) == 2
    for got, want in zip(fused, plain, strict=True):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
        assert got["accuracy"] == want["accuracy"]
    assert len(fused_running) == len(plain_running) == 14
    assert fused_running == pytest.approx(plain_running, rel=1e-5)
    assert len(set(fused_running)) == 14  # a new value at every iteration, not one per K-step call


def test_evaluator_folds_metrics_in_and_detach_takes_them_out(monkeypatch):
    """An evaluator's fused Accuracy equals the handler path; detaching recompiles without it."""
    updated = handler_updates(monkeypatch)
    values = []
    for debug in (False, True):
        evaluator = create_evaluator(
            state(), lambda model, b: {"y_pred": model(b["x"]) + b["x"][:, :3], "y": b["y"]}, debug=debug
        )
        acc = Accuracy()
        handle = acc.attach(evaluator, "accuracy")
        values.append(evaluator.run(batches(3)).metrics["accuracy"])
        assert len(updated) == (3 if debug else 0)
        handle.remove()
        assert evaluator.run(batches(3)).metrics == {}
    assert values[0] == values[1]
    assert 0.0 < values[0] < 1.0


def test_pmap_and_debug_keep_the_handler_path(monkeypatch):
    """Under pmap or debug=True metrics are updated by handlers (nothing folds into the step)."""
    updated = handler_updates(monkeypatch)
    for kwargs in ({"placement": Pmap()}, {"debug": True}):
        trainer = create_trainer(state(), loss_fn, **kwargs)
        Accuracy().attach(trainer, "accuracy")
        assert 0.0 <= trainer.run(batches(2)).metrics["accuracy"] <= 1.0
    assert updated == ["Accuracy"] * 4
    np.testing.assert_equal(Precision().fusable, False)


def test_fused_state_follows_the_step_and_moves_between_engines():
    """A fused metric's state, update count and reset follow the compiled step, per engine, exactly."""
    total = Sum(output_transform=lambda out: out["y"])  # the labels: exact integer sums
    first, second = create_trainer(state(), loss_fn), create_trainer(state(), loss_fn)
    seen = []
    total.attach(first, "total", usage="running_batch_wise")
    first.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(int(total.state)))
    data = batches(4)
    first.run(data)
    want = np.cumsum([int(np.sum(b["y"])) for b in data]).tolist()
    assert seen == want
    assert total.state_dict()["updates"] == 4
    total.reset()
    assert float(total.state) == 0.0
    with pytest.raises(RuntimeError, match="computed before any update"):
        total.compute()
    total.attach(second, "total", usage="running_batch_wise")
    second.run(data[:2])  # the running usage resets at STARTED
    assert total.compute() == want[1]
    assert total.state_dict()["updates"] == 2
    first.run(data[:1])  # back in `first`'s step
    assert total.compute() == want[0]
    assert total.state_dict()["updates"] == 1


def test_k_step_running_average_reads_nothing_back_per_iteration(monkeypatch):
    """With K=3 the fused running average publishes device values; the only host reads are epoch computes.

    On XLA:CPU the transfer guard is silent (see tests/engine/test_hot_path.py): the metrics' one host-read
    function is spied on.
    """
    import ember.metrics._metric as metric_module

    trainer = create_trainer(state(), loss_fn, steps_per_call=3)
    RunningAverage(output_transform=lambda out: out["loss"]).attach(trainer, "running")
    Accuracy().attach(trainer, "accuracy")
    published = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: published.append(e.state.metrics["running"]))
    reads = []
    to_host = metric_module._to_host
    monkeypatch.setattr(metric_module, "_to_host", lambda v: (reads.append(trainer.last_event_name), to_host(v))[1])
    trainer.run(batches(6), max_epochs=2)
    assert reads == [Events.EPOCH_COMPLETED, Events.EPOCH_COMPLETED]  # Accuracy's compute, once per epoch
    assert len(published) == 12
    assert all(isinstance(v, jax.Array) and v.shape == () for v in published)
    assert len({float(v) for v in published}) == 12


def test_published_values_are_fresh_outputs_a_handler_may_keep():
    """The published value is an output of its own each step: values kept by a handler stay valid."""
    trainer = create_trainer(state(), loss_fn)
    RunningAverage(output_transform=lambda out: out["loss"]).attach(trainer, "running")
    seen = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(e.state.metrics["running"]))
    trainer.run(batches(3))
    assert len({v.unsafe_buffer_pointer() for v in seen}) == 3  # all kept, all distinct and valid
    assert all(not v.is_deleted() for v in seen)


def test_the_fused_step_compiles_once_however_often_the_metrics_reset(caplog, fresh_compilations):
    """The accumulators are placed like the train state, so later calls do not compile the step again."""
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
