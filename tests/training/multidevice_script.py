"""Run in a subprocess with 8 simulated CPU devices by test_placement.py; prints one JSON object."""

import json
import os
import sys

assert "--xla_force_host_platform_device_count=8" in os.environ.get("XLA_FLAGS", "")

import jax  # noqa: E402  # XLA_FLAGS must be set before JAX starts
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ember import Events  # noqa: E402
from ember.metrics import Accuracy, Average, ConfusionMatrix, Loss  # noqa: E402
from ember.training import (  # noqa: E402
    DataParallel,
    Pmap,
    SingleDevice,
    TrainState,
    create_evaluator,
    create_trainer,
    fsdp,
)
from tests.training.models import LinenNet, NNXNet, SyncBNNet, batches, classification_loss  # noqa: E402

DATA = batches(6, size=32)


def train(state, placement, loss=classification_loss, data=DATA, steps_per_call=1):
    trainer = create_trainer(state, loss, placement=placement, steps_per_call=steps_per_call)
    trainer.run(data, max_epochs=2)
    return trainer.state


def max_diff(a, b):
    """The largest absolute difference over the numeric leaves (NNX RNG keys are compared by their data)."""

    def host(x):
        return np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x, np.float64)

    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return max((float(np.max(np.abs(host(x) - host(y)))) for x, y in pairs), default=0.0)


# SGD, not Adam: the Dense bias before BatchNorm has a mathematically zero gradient, and Adam would turn the
# float noise in it (which differs with the reduction order on 1 or 8 devices) into full-size updates.
def linen():
    return TrainState.from_linen(LinenNet(), jnp.ones((2, 4)), optax.sgd(0.1), rngs=("dropout",))


def nnx_state():
    return TrainState.from_nnx(NNXNet(nnx.Rngs(0, dropout=1)), optax.sgd(0.1))


def mlp():
    params = {"w1": jnp.full((4, 8), 0.1), "w2": jnp.full((8, 3), 0.1)}
    return TrainState.create(lambda p, x: jnp.tanh(x @ p["w1"]) @ p["w2"], params, optax.adam(1e-2))


out = {"devices": len(jax.devices())}
one = SingleDevice(jax.devices()[0])
for name, make in (("linen", linen), ("nnx", nnx_state), ("mlp", mlp)):
    ref = train(make(), one)
    dp = train(make(), DataParallel())
    out[f"{name}_dataparallel_params"] = max_diff(ref.train_state.params, dp.train_state.params)
    out[f"{name}_dataparallel_model_state"] = max_diff(ref.train_state.model_state, dp.train_state.model_state)
    out[f"{name}_dataparallel_sharding"] = str(jax.tree.leaves(dp.train_state.params)[0].sharding.spec)
    k10 = train(make(), DataParallel(), steps_per_call=4)
    out[f"{name}_dataparallel_k4_params"] = max_diff(ref.train_state.params, k10.train_state.params)

ref = train(mlp(), one)
pm = train(mlp(), Pmap())
out["mlp_pmap_params"] = max_diff(ref.train_state.params, pm.train_state.params)
out["pmap_state_sharding"] = str(jax.tree.leaves(pm.train_state.params)[0].sharding.spec)
out["pmap_loss_shape"] = list(pm.output["loss"].shape)
out["pmap_logits_shape"] = list(pm.output["logits"].shape)
pm_k = train(mlp(), Pmap(), steps_per_call=4)
out["mlp_pmap_k4_params"] = max_diff(ref.train_state.params, pm_k.train_state.params)
bn = train(linen(), Pmap())
stats = bn.train_state.model_state["batch_stats"]["BatchNorm_0"]["mean"]
out["pmap_bn_stats_shape"] = list(stats.shape)
out["pmap_bn_stats_spec"] = str(stats.sharding.spec)
nn_pm = train(nnx_state(), Pmap())
out["pmap_nnx_steps"] = int(nn_pm.train_state.step)


def sync_bn(axis_name):
    return TrainState.from_linen(SyncBNNet(axis_name=axis_name), jnp.ones((2, 4)), optax.sgd(0.1))


# BatchNorm given the pmap axis normalises with the global batch's statistics, so pmap matches one device.
bn_one, bn_pm = train(sync_bn(None), one), train(sync_bn("batch"), Pmap())
out["pmap_sync_bn_params"] = max_diff(bn_one.train_state.params, bn_pm.train_state.params)
out["pmap_sync_bn_model_state"] = max_diff(bn_one.train_state.model_state, bn_pm.train_state.model_state)


def epoch_metrics(placement):
    """Epoch metrics of a trainer whose step returns logits and labels: fused under jit, handlers under pmap."""

    def loss(model, batch):
        logits = model(batch["x"])
        value = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), batch["y"][:, None], axis=1))
        return value, {"y_pred": logits, "y": batch["y"]}

    trainer = create_trainer(mlp(), loss, placement=placement)
    for name, metric in (("loss", Average(key="loss")), ("acc", Accuracy()), ("cm", ConfusionMatrix(3))):
        metric.attach(trainer, name)
    seen = []
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: seen.append(dict(e.state.metrics)))
    trainer.run(DATA, max_epochs=2)
    fused = len(trainer.fused_metrics)
    return [{k: np.asarray(v).tolist() for k, v in m.items()} for m in seen], fused


ref_metrics, _ = epoch_metrics(one)
dp_metrics, dp_fused = epoch_metrics(DataParallel())
pm_metrics, pm_fused = epoch_metrics(Pmap())
out["metrics_fused_counts"] = [dp_fused, pm_fused]
out["metrics_dataparallel_equal"] = all(
    a["acc"] == b["acc"] and a["cm"] == b["cm"] and abs(a["loss"] - b["loss"]) < 1e-5
    for a, b in zip(ref_metrics, dp_metrics, strict=True)
)
out["metrics_pmap_equal"] = all(
    a["acc"] == b["acc"] and a["cm"] == b["cm"] and abs(a["loss"] - b["loss"]) < 1e-5
    for a, b in zip(ref_metrics, pm_metrics, strict=True)
)


def eval_metrics(placement):
    """Accuracy and loss of an evaluator over a batch of 16 and one of 13 (padded to split over 8 devices)."""
    evaluator = create_evaluator(mlp(), lambda m, b: {"y_pred": m(b["x"]), "y": b["y"]}, placement=placement)
    Accuracy().attach(evaluator, "acc")
    Loss(lambda p, y: -jnp.take_along_axis(jax.nn.log_softmax(p), y[:, None], axis=1)[:, 0]).attach(evaluator, "loss")
    full, short = batches(2, size=16)
    return dict(evaluator.run([full, {"x": short["x"][:13], "y": short["y"][:13]}]).metrics)


ref_eval = eval_metrics(one)
for name, placement in (("dataparallel", DataParallel()), ("pmap", Pmap())):
    got = eval_metrics(placement)
    out[f"eval_padded_{name}_equal"] = got["acc"] == ref_eval["acc"] and abs(got["loss"] - ref_eval["loss"]) < 1e-6
try:
    create_evaluator(mlp(), lambda m, b: m(b["x"]), placement=DataParallel()).run([batches(1, size=13)[0]])
except TypeError as e:
    out["eval_padded_needs_a_dict"] = str(e)

try:
    train(mlp(), DataParallel(), data=batches(2, size=12))
except ValueError as e:
    out["indivisible_error"] = str(e)


def precision_run(placement, precision, **kwargs):
    """Six steps of the MLP under ``precision``; the third batch holds 1e5, infinite in float16."""
    data = batches(6, size=32)
    data[2]["x"][0, 0] = 1e5
    trainer = create_trainer(mlp(), classification_loss, placement=placement, precision=precision, **kwargs)
    trainer.run(data)
    state = trainer.state.train_state
    skipped = None if state.guard is None else int(np.asarray(state.guard.skipped).reshape(-1)[0])
    return state, skipped, str(jax.tree.leaves(state.params)[0].dtype)


PRECISION_PLACEMENTS = {  # 16-mixed everywhere; bf16-true (a cast of the state) on the two that place it apart
    "16-mixed": ("dataparallel", "pmap", "fsdp", "dataparallel_k2_accumulate2"),
    "bf16-true": ("pmap", "fsdp"),
}
for precision, names in PRECISION_PLACEMENTS.items():
    ref, ref_skipped, _ = precision_run(one, precision)
    for name, placement, kwargs in (
        ("dataparallel", DataParallel(), {}),
        ("pmap", Pmap(), {}),
        ("fsdp", fsdp(min_size=1), {}),
        ("dataparallel_k2_accumulate2", DataParallel(), {"steps_per_call": 2, "accumulate_steps": 2}),
    ):
        if name not in names:
            continue
        got, skipped, dtype = precision_run(placement, precision, **kwargs)
        out[f"precision_{precision}_{name}"] = [max_diff(ref.params, got.params), skipped, ref_skipped, dtype]


def fsdp_state(batch):
    return TrainState.from_linen(LinenNet(), batch["x"][:2], optax.adam(1e-3), rngs=("dropout",))


lazy = create_trainer(fsdp_state, classification_loss, placement=fsdp(min_size=1))
planned = lazy.plan(DATA[0]).state  # from the shapes alone
lazy.build_state(DATA[0])
built = lazy.state.train_state
out["plan_fsdp_state"] = [
    [planned[name], lazy.plan(DATA[0]).state[name], sum(x.addressable_shards[0].data.nbytes for x in leaves)]
    for name, leaves in (
        ("params", jax.tree.leaves(built.params)),
        ("opt_state", jax.tree.leaves(built.opt_state)),
        ("model_state", jax.tree.leaves(built.model_state)),
    )
]
out["plan_fsdp_devices"] = lazy.plan(DATA[0]).devices
print(json.dumps(out))
