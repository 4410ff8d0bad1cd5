"""Ahead-of-time plans: the state's bytes per device, XLA's memory analysis, whether it fits, the batch search."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ember.training import MemoryPlan, Pmap, TrainState, create_evaluator, create_trainer
from ember.training._devices.plan import search_batch
from tests.training.models import LinenNet, batches, classification_loss


def _trainer(**kwargs):
    state = TrainState.from_linen(LinenNet(), jnp.ones((2, 4)), optax.adam(1e-3), rngs=("dropout",))
    return create_trainer(state, classification_loss, **kwargs)


BATCH = batches(1, size=32)[0]


def test_the_plan_counts_the_state_by_part_and_reads_xla_for_the_rest():
    trainer = _trainer()
    state = trainer.state.train_state
    plan = trainer.plan(BATCH, memory=2**30)
    nbytes = {name: sum(x.nbytes for x in jax.tree.leaves(getattr(state, name))) for name in ("params", "model_state")}
    assert plan.state["params"] == nbytes["params"] == (4 * 16 + 16 + 2 * 16 + 16 * 3 + 3) * 4  # BN: scale, bias
    assert plan.state["model_state"] == nbytes["model_state"] == 2 * 16 * 4  # batch norm's mean and variance
    assert plan.state["opt_state"] == 2 * nbytes["params"] + 4  # Adam's two moments and its count
    assert plan.state["other"] == 4 + 8  # the step (int32) and the RNG key (two uint32)
    assert (plan.step, plan.batch_size, plan.devices) == ("train", 32, 1)
    assert plan.aliased > 0
    assert plan.arguments > plan.aliased
    assert plan.peak == plan.arguments + plan.outputs - plan.aliased + plan.temporaries
    assert plan.flops > 2 * 32 * (4 * 16 + 16 * 3)  # at least the forward pass's products
    assert plan.fits is True
    assert plan.verdict() == f"fits: needs {_size(plan.peak)} of 1.00 GiB per device"


def _size(n):
    return f"{n / 2**10:.2f} KiB" if n < 2**20 else f"{n / 2**20:.2f} MiB"


def test_a_plan_compiles_without_running_a_step_or_building_a_lazy_state():
    """A lazy trainer is planned from the factory's shapes: nothing is built, the step counter never moves."""
    built = []

    def factory(batch):
        built.append(isinstance(batch["x"], jax.core.Tracer))
        return TrainState.from_linen(LinenNet(), batch["x"], optax.adam(1e-3), rngs=("dropout",))

    trainer = create_trainer(factory, classification_loss)
    plan = trainer.plan(BATCH, memory=2**30)
    assert trainer.state.train_state is None
    assert built == [True]
    assert plan.state == _trainer().plan(BATCH, memory=2**30).state
    assert trainer.state.iteration == 0


def test_a_step_over_budget_does_not_fit_and_says_by_how_much():
    plan = _trainer().plan(BATCH, memory=1000)
    assert plan.fits is False
    assert plan.verdict() == f"does not fit: needs {_size(plan.peak)} of 1000 B per device"
    assert str(plan).splitlines()[0] == "train step on 1 device, batch 32, per device:"
    assert str(plan).splitlines()[-1] == plan.verdict()


def test_without_a_budget_on_cpu_the_plan_says_no_limit_is_known():
    plan = _trainer().plan(BATCH)
    assert (plan.limit, plan.fits) == (None, None)
    assert plan.verdict().endswith("per device (no memory limit known here: plan with a budget to compare)")


def test_k_steps_per_call_plan_the_k_step_call():
    """The K-step call takes four stacked batches; FLOPs stay per step (XLA counts a loop's body once)."""
    one, four = _trainer().plan(BATCH, memory=2**30), _trainer(steps_per_call=4).plan(BATCH, memory=2**30)
    batch_bytes = sum(x.nbytes for x in jax.tree.leaves(BATCH))
    assert four.arguments - one.arguments == 3 * batch_bytes
    assert four.flops == pytest.approx(one.flops, rel=0.01)


def test_an_evaluator_plans_its_eval_step():
    trainer = _trainer()
    plan = create_evaluator(trainer, lambda m, b: m(b["x"])).plan(BATCH, memory=2**30)
    assert (plan.step, plan.aliased) == ("eval", 0)
    assert plan.flops < trainer.plan(BATCH, memory=2**30).flops


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match=re.escape("`memory` must be a number of bytes (an int >= 1) or None, got 0.")):
        _trainer().plan(BATCH, memory=0)
    with pytest.raises(ValueError, match=re.escape("max_batch() needs a memory budget")):
        _trainer().max_batch(BATCH)
    with pytest.raises(ValueError, match=re.escape("plan() reads one jit-compiled step; under Pmap")):
        _trainer(placement=Pmap()).plan(BATCH)


def test_the_batch_search_finds_the_same_batch_twice_by_compiling_only():
    """The largest multiple of 32 whose plan fits: the next multiple does not, and a second search agrees."""
    trainer = _trainer()
    budget = trainer.plan({k: np.concatenate([v] * 8) for k, v in BATCH.items()}).peak  # what a batch of 256 needs
    found = trainer.max_batch(BATCH, memory=budget, multiple_of=32)
    assert found == trainer.max_batch(BATCH, memory=budget, multiple_of=32)
    assert found >= 256
    grown = {k: jax.ShapeDtypeStruct((found + 32, *v.shape[1:]), v.dtype) for k, v in BATCH.items()}
    assert trainer.plan(grown, memory=budget).fits is False
    assert trainer.state.iteration == 0
    assert int(trainer.state.train_state.step) == 0


def test_the_search_tries_each_size_once_and_stops():
    sizes = search_batch(lambda b: b <= 1000, 8, 2**20, start=32)
    assert sizes == (1000, [32, 64, 128, 256, 512, 1024, 768, 896, 960, 992, 1008, 1000])
    assert search_batch(lambda b: False, 8, 2**20, start=32) == (None, [32, 16, 8])
    assert search_batch(lambda b: True, 8, 100, start=32) == (96, [32, 64, 96])


def test_a_plan_is_a_frozen_record():
    plan = MemoryPlan("train", 8, 1, {"params": 4}, 10, 10, 5, 1, 0, 0.0, None)
    assert plan.peak == 16
    with pytest.raises(AttributeError):
        plan.limit = 1  # type: ignore[misc]
