import re

import jax
import jax.numpy as jnp
import optax
import pytest

from ember.handlers import Throughput
from ember.training import TrainState, create_trainer
from ember.writers import Writer

BATCH, IN, OUT = 64, 256, 512


class Recorder(Writer):
    def __init__(self):
        self.scalars = []

    def write_scalars(self, step, values):
        self.scalars.append((step, dict(values)))


def dense_trainer():
    state = TrainState.create(lambda p, x: x @ p, jnp.zeros((IN, OUT)), optax.sgd(0.01))
    return create_trainer(state, lambda model, x: jnp.mean(model(x) ** 2))


def test_flops_match_a_hand_count_and_nothing_is_read_from_the_device():
    """One Dense layer's train step: the forward matmul and the weight gradient, 4 * BATCH * IN * OUT FLOPs."""
    recorder, trainer = Recorder(), dense_trainer()
    speed = Throughput(recorder, every=10, tokens=lambda batch: 7 * batch.shape[0], peak_flops=1e12)
    speed.attach(trainer)
    with jax.transfer_guard_device_to_host("disallow"):
        trainer.run([jnp.ones((BATCH, IN))] * 20)
    last = speed.last
    assert last["flops_per_step"] == pytest.approx(4 * BATCH * IN * OUT, rel=0.1)
    assert last["tokens_per_sec"] == pytest.approx(7 * last["examples_per_sec"])
    assert 0 < last["step_ms_p50"] <= last["step_ms_p90"] <= last["step_ms_p99"]
    assert last["mfu"] == pytest.approx(last["tflops_per_sec"] * 1e12 / 1e12)
    assert [step for step, _ in recorder.scalars] == [10, 20]
    assert sorted(recorder.scalars[-1][1]) == [
        "perf/examples_per_sec",
        "perf/flops_per_step",
        "perf/mfu",
        "perf/step_ms_p50",
        "perf/step_ms_p90",
        "perf/step_ms_p99",
        "perf/tflops_per_sec",
        "perf/tokens_per_sec",
    ]


def test_a_cpu_has_no_peak_so_no_mfu():
    trainer = dense_trainer()
    speed = Throughput(every=5)
    speed.attach(trainer)
    trainer.run([jnp.ones((BATCH, IN))] * 5)
    assert "mfu" not in speed.last
    assert speed.last["examples_per_sec"] > 0


def test_throughput_arguments_are_checked():
    with pytest.raises(ValueError, match=re.escape("`every` must be a positive int, got 0.")):
        Throughput(every=0)
    with pytest.raises(TypeError, match=re.escape("`tokens` must be callable as tokens(batch) -> int, got 3.")):
        Throughput(tokens=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("`peak_flops` must be a positive number of FLOP/s, got -1.")):
        Throughput(peak_flops=-1)
