"""Run in a subprocess with 8 simulated CPU devices by test_sharded.py; prints one JSON object."""

import json
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path

assert "--xla_force_host_platform_device_count=8" in os.environ.get("XLA_FLAGS", "")

import jax  # noqa: E402  # XLA_FLAGS must be set before JAX starts
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import linen as nn  # noqa: E402
from flax import nnx, serialization  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ember import Engine, Events  # noqa: E402
from ember.checkpoint import OrbaxStore, init_from  # noqa: E402
from ember.handlers import (  # noqa: E402
    Checkpoint,
    EarlyStopping,
    GradientSpikeMonitor,
    ParamStats,
    TerminateOnNan,
)
from ember.metrics import Accuracy, Average  # noqa: E402
from ember.training import (  # noqa: E402
    DataParallel,
    ReduceLROnPlateau,
    Sharded,
    SingleDevice,
    TrainState,
    create_evaluator,
    create_trainer,
    ema,
    ema_params,
    fsdp,
    lr_find,
    scale_by_plateau,
)
from tests.training.models import batches  # noqa: E402

out: dict = {"devices": len(jax.devices())}
DATA = [{"x": np.tile(b["x"], (1, 8)), "y": b["y"]} for b in batches(20, size=32)]  # 20 steps, 32 features
EXTRAS = ("grad_norm", "param_norm", "update_norm")


class Net(nn.Module):
    """Dense -> BatchNorm -> relu -> Dropout -> Dense -> Dense, wide enough to shard."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Dense(256)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
        x = nn.Dropout(0.2, deterministic=not train)(nn.relu(x))
        x = nn.relu(nn.Dense(256)(x))
        return nn.Dense(8)(x)


class NNXNet(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.dense1 = nnx.Linear(32, 256, rngs=rngs)
        self.bn = nnx.BatchNorm(256, momentum=0.9, rngs=rngs)
        self.dropout = nnx.Dropout(0.2, rngs=rngs)
        self.dense2 = nnx.Linear(
            256, 256, kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "fsdp")), rngs=rngs
        )
        self.dense3 = nnx.Linear(256, 8, rngs=rngs)

    def __call__(self, x):
        return self.dense3(nnx.relu(self.dense2(self.dropout(nnx.relu(self.bn(self.dense1(x)))))))


def loss(model, batch):
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), {
        "y_pred": logits,
        "y": batch["y"],
    }


def linen_state(tx, placement=None):
    return TrainState.from_linen(Net(), DATA[0]["x"][:1], tx, rngs=("dropout",), placement=placement)


def nnx_state(tx, placement=None):
    if placement is not None:
        return TrainState.from_nnx(lambda: NNXNet(nnx.Rngs(0)), tx, placement=placement)
    with jax.set_mesh(Mesh(np.array(jax.devices()[:1]), ("fsdp",))):  # Flax needs a mesh for the annotation
        return TrainState.from_nnx(NNXNet(nnx.Rngs(0)), tx)


def train(state, placement, data=DATA, **kwargs):
    trainer = create_trainer(state, loss, placement=placement, extras=EXTRAS, **kwargs)
    Average(key="loss").attach(trainer, "loss")
    Accuracy().attach(trainer, "accuracy")
    norms = []
    trainer.add_event_handler(
        Events.ITERATION_COMPLETED, lambda e: norms.append([float(e.state.output[k]) for k in EXTRAS])
    )
    trainer.run(data, max_epochs=1)
    return trainer, np.array(norms)


def host(x):
    return np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x, np.float64)


def max_diff(a, b):
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return max((float(np.max(np.abs(host(x) - host(y)))) for x, y in pairs), default=0.0)


def device_bytes(tree):
    """Bytes of ``tree`` held on each device (summed over every leaf's addressable shards)."""
    held: dict = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            held[shard.device.id] = held.get(shard.device.id, 0) + shard.data.nbytes
    return held


eight = fsdp(min_size=1024)
trained = {}  # (model, optimizer, steps): the trainers on one device and on 8
for name, make in (("linen", linen_state), ("nnx", nnx_state)):
    for opt_name, tx in (("momentum", optax.sgd(0.05, momentum=0.9)), ("adam", optax.adam(1e-3))):
        for kw_name, kwargs in (("k1", {}), ("k4_acc2", {"steps_per_call": 4, "accumulate_steps": 2})):
            if opt_name == "adam" and kw_name != "k1":  # K-step groups are checked with momentum's exact sums
                continue
            one, one_norms = train(make(tx), SingleDevice(), **kwargs)
            sharded, sharded_norms = train(make(tx, eight), eight, **kwargs)
            trained[name, opt_name, kw_name] = one, sharded
            st1, st8 = one.state.train_state, sharded.state.train_state
            key = f"{name}_{opt_name}_{kw_name}"
            out[f"{key}_params"] = max_diff(st1.params, st8.params)
            out[f"{key}_opt_state"] = max_diff(st1.opt_state, st8.opt_state)
            out[f"{key}_model_state"] = max_diff(st1.model_state, st8.model_state)
            out[f"{key}_norms"] = float(np.max(np.abs(one_norms - sharded_norms) / (np.abs(one_norms) + 1e-12)))
            out[f"{key}_metrics"] = [one.state.metrics, sharded.state.metrics]
            if key.endswith("adam_k1"):  # another order of the same sums: data parallel, the state replicated
                again, _ = train(make(tx), DataParallel())
                out[f"{name}_adam_spread"] = max_diff(st1.params, again.state.train_state.params)
    st8 = sharded.state.train_state
    out[f"{name}_specs"] = {
        jax.tree_util.keystr(p): str(v.sharding.spec) for p, v in jax.tree_util.tree_flatten_with_path(st8.params)[0]
    }
    held = device_bytes((st8.params, st8.opt_state))
    total = sum(x.nbytes for x in jax.tree.leaves((st8.params, st8.opt_state)))
    out[f"{name}_bytes"] = {"per_device_max": max(held.values()), "total": total, "devices": len(held)}

# An evaluator on the sharded trainer's state: the same accuracy as on one device (linen, Adam, a step per call).
evals = []
for placement, trainer in zip((SingleDevice(), eight), trained["linen", "adam", "k1"], strict=True):
    evaluator = create_evaluator(trainer, lambda m, b: {"y_pred": m(b["x"]), "y": b["y"]}, placement=placement)
    Accuracy().attach(evaluator, "accuracy")
    evals.append(evaluator.run(DATA[:4]).metrics["accuracy"])
out["eval_accuracy"] = evals


# Tensor parallel over a 2 x 4 (data x model) mesh: a transformer block with rules, against one device.
class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(4, name="attention")(h, h)
        h = nn.gelu(nn.Dense(128, name="mlp_in")(nn.LayerNorm()(x)))
        return x + nn.Dense(32, name="mlp_out")(h)


TP_RULES = (
    (r"attention\.(query|key|value)\.kernel", P(None, "model", None)),
    (r"attention\.(query|key|value)\.bias", P("model", None)),
    (r"attention\.out\.kernel", P("model", None, None)),
    (r"mlp_in\.kernel", P(None, "model")),
    (r"mlp_in\.bias", P("model")),
    (r"mlp_out\.kernel", P("model", None)),
)
tokens = np.random.default_rng(1).normal(size=(20, 8, 6, 32)).astype(np.float32)
SEQ = [{"x": t, "y": np.roll(t, 1, axis=1)} for t in tokens]


def mse(model, batch):
    return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)


mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
tp = Sharded(mesh, rules=TP_RULES)
finals = []
for placement in (SingleDevice(), tp):
    tx = optax.sgd(0.05, momentum=0.9)
    state = TrainState.from_linen(Block(), SEQ[0]["x"][:1], tx, placement=placement if placement is tp else None)
    trainer = create_trainer(state, mse, placement=placement)
    trainer.run(SEQ, max_epochs=1)
    finals.append(trainer.state.train_state)
out["tp_params"] = max_diff(finals[0].params, finals[1].params)
out["tp_batch_axes"] = list(tp.batch_axes)
out["tp_specs"] = {
    jax.tree_util.keystr(p): str(v.sharding.spec) for p, v in jax.tree_util.tree_flatten_with_path(finals[1].params)[0]
}


# The character transformer written twice, linen and NNX, with the same logical axis names and the same
# logical_rules on a 4 x 2 (fsdp x model) mesh: each trains as on one device, and both are laid out alike.
LM_RULES = (("vocab", None), ("embed", "fsdp"), ("heads", "model"), ("mlp", "model"))
VOCAB, WIDTH, LENGTH = 64, 32, 16
LM_DATA = [{"tokens": t} for t in np.random.default_rng(2).integers(0, VOCAB, size=(6, 8, LENGTH + 1)).astype(np.int32)]


def causal_attention(q, k, v):
    scores = jnp.einsum("bqd,bkd->bqk", q, k) / np.sqrt(q.shape[-1])
    mask = jnp.tril(jnp.ones((q.shape[1], q.shape[1]), bool))
    return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(jnp.where(mask, scores, -1e9)), v)


class LinenLM(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        named = lambda *names: nn.with_logical_partitioning(nn.initializers.lecun_normal(), names)  # noqa: E731
        x = nn.Embed(
            VOCAB, WIDTH, embedding_init=nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed"))
        )(tokens)
        h = nn.LayerNorm()(x)
        q, k, v = (nn.Dense(WIDTH, kernel_init=named("embed", "heads"), name=n)(h) for n in ("query", "key", "value"))
        x = x + nn.Dense(WIDTH, kernel_init=named("heads", "embed"), name="out")(causal_attention(q, k, v))
        h = nn.gelu(nn.Dense(4 * WIDTH, kernel_init=named("embed", "mlp"), name="up")(nn.LayerNorm()(x)))
        x = x + nn.Dense(WIDTH, kernel_init=named("mlp", "embed"), name="down")(h)
        return nn.Dense(VOCAB, kernel_init=named("embed", "vocab"), name="logits")(nn.LayerNorm()(x))


class NNXLM(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        named = lambda *names: nnx.with_partitioning(nnx.initializers.lecun_normal(), names)  # noqa: E731
        self.embed = nnx.Embed(
            VOCAB,
            WIDTH,
            embedding_init=nnx.with_partitioning(nnx.initializers.normal(1.0), ("vocab", "embed")),
            rngs=rngs,
        )
        self.norm1, self.norm2, self.norm3 = (nnx.LayerNorm(WIDTH, rngs=rngs) for _ in range(3))
        self.query, self.key, self.value = (
            nnx.Linear(WIDTH, WIDTH, kernel_init=named("embed", "heads"), rngs=rngs) for _ in range(3)
        )
        self.out = nnx.Linear(WIDTH, WIDTH, kernel_init=named("heads", "embed"), rngs=rngs)
        self.up = nnx.Linear(WIDTH, 4 * WIDTH, kernel_init=named("embed", "mlp"), rngs=rngs)
        self.down = nnx.Linear(4 * WIDTH, WIDTH, kernel_init=named("mlp", "embed"), rngs=rngs)
        self.logits = nnx.Linear(WIDTH, VOCAB, kernel_init=named("embed", "vocab"), rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        h = self.norm1(x)
        x = x + self.out(causal_attention(self.query(h), self.key(h), self.value(h)))
        x = x + self.down(nnx.gelu(self.up(self.norm2(x))))
        return self.logits(self.norm3(x))


def next_token_loss(model, batch):
    logits = model(batch["tokens"][:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["tokens"][:, 1:]).mean()


lm_mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("fsdp", "model"))
fsdp_mesh = Mesh(np.array(jax.devices()), ("fsdp",))
out["lm"] = {}
for name in ("linen", "nnx"):
    runs = []
    for placement in (SingleDevice(), Sharded(lm_mesh, logical_rules=LM_RULES)):
        sharded = placement if isinstance(placement, Sharded) else None
        tx = optax.sgd(0.1, momentum=0.9)
        if name == "linen":
            state = TrainState.from_linen(LinenLM(), LM_DATA[0]["tokens"][:1, :-1], tx, placement=sharded)
        elif sharded is not None:
            state = TrainState.from_nnx(lambda: NNXLM(nnx.Rngs(0)), tx, placement=sharded)
        else:
            one_device = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "model"))
            with jax.set_mesh(one_device), nn.logical_axis_rules(LM_RULES):
                state = TrainState.from_nnx(NNXLM(nnx.Rngs(0)), tx)  # one device: the names resolve to nothing
        trainer = create_trainer(state, next_token_loss, placement=placement)
        trainer.run(LM_DATA, max_epochs=2)
        runs.append(trainer)
    lm_one, lm_sharded = runs
    table = lm_sharded.placement.layout(lm_sharded.state.train_state)
    out["lm"][name] = {
        "params": max_diff(lm_one.state.train_state.params, lm_sharded.state.train_state.params),
        "specs": {path: str(spec) for path, _, spec, _ in lm_sharded.placement.partitioner.layout},
        "table_rows": [re.split(r"\s{2,}", row.strip()) for row in table.splitlines()],
    }

# fsdp() takes logical rules; a placement that leaves the large arrays replicated says so, in a warning and its summary.
lm_names = (("vocab", None), ("embed", "fsdp"), ("heads", None), ("mlp", None))
named_fsdp = fsdp(min_size=1024, logical_rules=lm_names)
named_state = TrainState.from_linen(LinenLM(), LM_DATA[0]["tokens"][:1, :-1], optax.sgd(0.1), placement=named_fsdp)
out["fsdp_logical"] = str(named_state.params["up"]["kernel"].sharding.spec)
everything_replicated = Sharded(
    fsdp_mesh,
    fsdp_axis="fsdp",
    min_size=1024,
    logical_rules=tuple((n, None) for n in ("vocab", "embed", "heads", "mlp")),
)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    TrainState.from_linen(LinenLM(), LM_DATA[0]["tokens"][:1, :-1], optax.sgd(0.1), placement=everything_replicated)
out["replicated_warning"] = [str(w.message) for w in caught]
out["replicated_summary"] = everything_replicated.summary()


# Bad input: each a named error before the first step.
def message(fn):
    try:
        fn()
    except (ValueError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


out["errors"] = {
    "rule_axis": message(lambda: Sharded(fsdp_mesh, rules=((r"kernel", P("model")),))),
    "rule_divisible": message(
        lambda: Sharded(fsdp_mesh, rules=((r"params\.w", P("fsdp")),)).put_state(
            TrainState.create(lambda p, x: x @ p["w"], {"w": jnp.zeros((3, 5))}, optax.sgd(0.1))
        )
    ),
    "fsdp_axis": message(lambda: Sharded(fsdp_mesh, fsdp_axis="data")),
    "batch": message(lambda: eight.prepare_batch({"x": np.ones((12, 32))})),
    "logical": message(
        lambda: TrainState.from_linen(
            nn.Dense(8, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))),
            np.ones((1, 16), np.float32),
            optax.sgd(0.1),
            placement=Sharded(fsdp_mesh, logical_rules=(("embed", "fsdp"),)),
        )
    ),
    "unmatched_rule": message(
        lambda: Sharded(fsdp_mesh, rules=((r"Dense_0\.kernl", P(None, "fsdp")),)).put_state(
            TrainState.from_linen(Net(), DATA[0]["x"][:1], optax.sgd(0.1))
        )
    ),
    "unused_logical_name": message(
        lambda: TrainState.from_linen(
            LinenLM(),
            LM_DATA[0]["tokens"][:1, :-1],
            optax.sgd(0.1),
            placement=Sharded(lm_mesh, logical_rules=(*LM_RULES, ("mlpp", "model"))),
        )
    ),
}
auto = Sharded(fsdp_mesh, fsdp_axis="fsdp", min_size=1)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    auto.put_state(
        TrainState.create(lambda p, x: x @ p["w"], {"w": jnp.zeros((3, 5)), "v": jnp.zeros((16, 4))}, optax.sgd(0.1))
    )
out["auto_summary"] = auto.summary()
out["auto_warning"] = [str(w.message) for w in caught]


# Sharded checkpoints (orbax): bit-exact resume on the same mesh, and restore onto other meshes.
def sharded_trainer(placement, state=None):
    state = state or linen_state(optax.adam(1e-3), placement if isinstance(placement, Sharded) else None)
    trainer = create_trainer(state, loss, placement=placement)
    return trainer


def restored(placement, folder):
    trainer = sharded_trainer(placement)
    info = Checkpoint({"trainer": trainer}, OrbaxStore(folder)).resume()
    return trainer, info


with tempfile.TemporaryDirectory() as tmp:
    straight = sharded_trainer(eight)
    straight.run(DATA, max_epochs=1)  # 20 steps
    first = sharded_trainer(eight)
    saver = Checkpoint({"trainer": first}, OrbaxStore(f"{tmp}/a"))
    saver.attach(first, Events.ITERATION_COMPLETED(once=8))
    first.run(DATA[:8], max_epochs=1)
    saver.store.close()
    saved = jax.tree.map(np.asarray, first.state.train_state.params)
    second, info = restored(eight, f"{tmp}/a")
    out["resume_step"] = info.step
    second.state.max_epochs = None
    second.run(DATA[8:], max_epochs=1)
    out["resume_bit_exact"] = max_diff(straight.state.train_state.params, second.state.train_state.params)
    out["resume_sharding_kept"] = str(second.state.train_state.params["Dense_1"]["kernel"].sharding.spec)
    targets = {
        "fsdp4": fsdp(jax.devices()[:4], min_size=1024),
        "one": SingleDevice(),
        "tp2x4": Sharded(mesh, rules=((r"Dense_1\.kernel", P(None, "model")),)),
    }
    elastic = {}
    for name, placement in targets.items():
        trainer, info = restored(placement, f"{tmp}/a")
        params = trainer.state.train_state.params
        elastic[name] = {
            "equal": max_diff(saved, params),
            "spec": str(getattr(params["Dense_1"]["kernel"].sharding, "spec", "one device")),
            "devices": len(params["Dense_1"]["kernel"].sharding.device_set),
        }
        trainer.state.max_epochs = None
        trainer.run(DATA[8:12], max_epochs=1)  # training continues on the new mesh
        elastic[name]["trained_on"] = trainer.state.iteration
    out["elastic"] = elastic

# Stock handlers and iterate() on a sharded trainer: they read only what they need, no parameter gathered.
watched = create_trainer(linen_state(optax.adam(1e-3), eight), loss, placement=eight, extras=("grad_norm",))
spikes = GradientSpikeMonitor(factor=100.0)
spikes.attach(watched)
TerminateOnNan(lambda o: o["loss"]).attach(watched)
counted = ParamStats()
counted.attach(watched)
checker = create_evaluator(watched, lambda m, b: {"y_pred": m(b["x"]), "y": b["y"]}, placement=eight)
Accuracy().attach(checker, "accuracy")
stopper = EarlyStopping(1, lambda e: e.state.metrics["accuracy"], watched, mode="max")
checker.add_event_handler(Events.COMPLETED, stopper)
watched.add_event_handler(Events.EPOCH_COMPLETED, lambda e: checker.run(DATA[:2]))
watched.run(DATA[:4], max_epochs=3)
seen = [
    s.iteration
    for s in watched.iterate(DATA[:4], Events.ITERATION_COMPLETED(every=2), max_epochs=watched.state.epoch + 1)
]
out["handlers"] = {
    "params": counted.count,
    "spikes": spikes.spikes,
    "iterate": seen,
}

# The average of the parameters (ember.training.ema) lives in the optimizer state: sharded as the params are.
averaging = create_trainer(linen_state(ema(optax.adam(1e-3)), eight), loss, placement=eight)
averaging.run(DATA[:2])
out["ema_specs"] = [
    [str(p.sharding.spec), str(a.sharding.spec)]
    for p, a in zip(
        jax.tree.leaves(averaging.state.train_state.params),
        jax.tree.leaves(ema_params(averaging.state.train_state)),
        strict=True,
    )
]

# The range test and a plateau's scale on sharded state: the trainer's state stays sharded, and untouched.
tuned = create_trainer(
    linen_state(scale_by_plateau(optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)), eight),
    loss,
    placement=eight,
)
before = np.asarray(jax.device_get(tuned.state.train_state.params["Dense_1"]["kernel"]))
found = lr_find(tuned, DATA[:4], start_lr=1e-4, end_lr=1.0, num_iter=8)
after = np.asarray(jax.device_get(tuned.state.train_state.params["Dense_1"]["kernel"]))
plateau, scored = ReduceLROnPlateau(tuned, "loss", patience=1, factor=0.5), Engine(lambda e, b: b)
for value in (1.0, 1.0):
    scored.state.metrics["loss"] = value
    plateau(scored)
tuned.run(DATA[:2])
out["tuning"] = {
    "tried": len(found.lrs),
    "untouched": bool(np.array_equal(before, after)),
    "scale": plateau.scale,
    "kernel_spec": str(tuned.state.train_state.params["Dense_1"]["kernel"].sharding.spec),
}

# init_from onto a sharded target: each leaf put straight onto its own sharding, equal to the one-device source.
source = linen_state(optax.sgd(0.1))
weights = Path(tempfile.mkdtemp()) / "w.msgpack"
weights.write_bytes(serialization.msgpack_serialize({"params": jax.device_get(source.params)}))
fresh_sharded = linen_state(optax.adam(1e-3), eight)
started, report = init_from(fresh_sharded, weights, fresh=["params.Dense_2"])
out["init_from"] = {
    "loaded": report.loaded,
    "fresh": sorted(report.fresh),
    "same_sharding": all(
        a.sharding == b.sharding
        for a, b in zip(jax.tree.leaves(started.params), jax.tree.leaves(fresh_sharded.params), strict=True)
    ),
    "equal": all(
        np.array_equal(np.asarray(jax.device_get(started.params[k]["kernel"])), np.asarray(source.params[k]["kernel"]))
        for k in ("Dense_0", "Dense_1")
    ),
    "head_fresh": bool(
        np.array_equal(
            np.asarray(jax.device_get(started.params["Dense_2"]["kernel"])),
            np.asarray(jax.device_get(fresh_sharded.params["Dense_2"]["kernel"])),
        )
    ),
    "kernel_spec": str(started.params["Dense_1"]["kernel"].sharding.spec),
}

print(json.dumps(out))
