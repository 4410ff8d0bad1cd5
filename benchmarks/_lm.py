"""Workload ``lm``: a GPT-style decoder written as users write them, ember against a hand-written loop.

Flax NNX, every kernel named by logical axes (``embed``, ``heads``, ``mlp``, ``vocab``), rotary positions,
RMSNorm, a tied output head; about 100 M parameters at full size (768 wide, 14 blocks, 1,024 tokens of context),
bytes of the standard library's source code as tokens. ``"bf16-mixed"``, AdamW with a linear warm-up and a
cosine decay, FSDP over every device when there are several (the logical names mapped to the ``fsdp`` axis).

ember's side attaches what a user would: a running average of the loss, a perplexity evaluation and an Orbax
checkpoint every ``every`` steps, ``Throughput``. The hand loop does the same work: one jitted step with the
state donated and placed by the same shardings, the parameters cast to bfloat16 by hand inside the loss, the
running loss in the step, a jitted evaluation, ``orbax.checkpoint``'s ``StandardCheckpointer``.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _accel as accel
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _accel import Side
from flax import nnx

from ember import Events
from ember.checkpoint import OrbaxStore
from ember.handlers import Checkpoint, Evaluate, Throughput
from ember.metrics import Perplexity, RunningAverage
from ember.training import TrainState, create_evaluator, create_trainer, fsdp


@dataclass(frozen=True)
class Size:
    width: int
    blocks: int
    heads: int
    context: int
    batch: int
    steps: int  # per timed window
    every: int  # an evaluation and a checkpoint every this many steps
    eval_batches: int


FULL = Size(width=768, blocks=14, heads=12, context=1024, batch=32, steps=100, every=50, eval_batches=4)
SMOKE = Size(width=32, blocks=1, heads=2, context=32, batch=4, steps=2, every=2, eval_batches=1)
VOCAB = 256
RULES = (("embed", "fsdp"), ("heads", None), ("mlp", None), ("vocab", None))


def _init(names: tuple[str | None, ...], scale: float = 0.02) -> Any:
    return nnx.with_partitioning(nnx.initializers.normal(scale), names)


class RMSNorm(nnx.Module):
    def __init__(self, width: int) -> None:
        self.scale = nnx.Param(nnx.with_partitioning(nnx.initializers.ones, ("embed",))(jax.random.key(0), (width,)))

    def __call__(self, x: jax.Array) -> jax.Array:
        norm = jax.lax.rsqrt(jnp.mean(jnp.square(x.astype(jnp.float32)), -1, keepdims=True) + 1e-6)
        return (x * norm.astype(x.dtype)) * self.scale.value.astype(x.dtype)


def rotary(x: jax.Array) -> jax.Array:
    """Rotary position embedding over the last axis of ``x`` (batch, time, heads, head width)."""
    half = x.shape[-1] // 2
    freq = 1.0 / (10000 ** (jnp.arange(half, dtype=jnp.float32) / half))
    angle = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * freq[None, :]
    sin, cos = jnp.sin(angle)[None, :, None, :].astype(x.dtype), jnp.cos(angle)[None, :, None, :].astype(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


class Block(nnx.Module):
    def __init__(self, size: Size, rngs: nnx.Rngs) -> None:
        w = size.width
        self.heads = size.heads
        self.norm1, self.norm2 = RMSNorm(w), RMSNorm(w)
        self.qkv = nnx.Linear(w, 3 * w, use_bias=False, kernel_init=_init(("embed", "heads")), rngs=rngs)
        self.out = nnx.Linear(w, w, use_bias=False, kernel_init=_init(("heads", "embed")), rngs=rngs)
        self.up = nnx.Linear(w, 4 * w, use_bias=False, kernel_init=_init(("embed", "mlp")), rngs=rngs)
        self.down = nnx.Linear(4 * w, w, use_bias=False, kernel_init=_init(("mlp", "embed")), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, w = x.shape
        q, k, v = jnp.split(self.qkv(self.norm1(x)).reshape(b, t, 3 * self.heads, w // self.heads), 3, axis=2)
        attended = jax.nn.dot_product_attention(rotary(q), rotary(k), v, is_causal=True)
        x = x + self.out(attended.reshape(b, t, w))
        return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))


class GPT(nnx.Module):
    def __init__(self, size: Size, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(VOCAB, size.width, embedding_init=_init(("vocab", "embed"), 1.0), rngs=rngs)
        self.blocks = nnx.List([Block(size, rngs) for _ in range(size.blocks)])
        self.norm = RMSNorm(size.width)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.embed.attend(self.norm(x))  # the output head shares the embedding


def token_losses(logits: jax.Array, seq: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), seq[:, 1:])


def data(size: Size) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    """Training and validation batches of byte tokens from the standard library's own source files."""
    need = (size.steps + size.eval_batches) * size.batch * (size.context + 1)
    chunks, have = [], 0
    for path in sorted(Path(os.__file__).parent.rglob("*.py")):
        chunks.append(path.read_bytes())
        have += len(chunks[-1])
        if have >= need:
            break
    tokens = np.frombuffer(b"".join(chunks), np.uint8)[:need].astype(np.int32)
    seqs = tokens.reshape(-1, size.batch, size.context + 1)
    batches = [{"seq": s} for s in seqs]
    return batches[: size.steps], batches[size.steps :]


def optimizer(size: Size) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-4, max(1, size.steps // 10), 10 * size.steps)
    return optax.adamw(schedule, b2=0.95, weight_decay=0.1)


def placement_for() -> Any:
    """FSDP over every device (on one device too: NNX builds named parameters only under a mesh)."""
    return fsdp(logical_rules=RULES)


def built(size: Size, placement: Any) -> TrainState:
    return TrainState.from_nnx(lambda: GPT(size, nnx.Rngs(0)), optimizer(size), placement=placement)


def ember_side(size: Size, root: Path) -> Side:
    train, val = data(size)
    placement = placement_for()
    state = built(size, placement)
    initial = jax.device_get(state)
    trainer = create_trainer(
        state, lambda m, b: token_losses(m(b["seq"][:, :-1]), b["seq"]).mean(), placement=placement,
        precision="bf16-mixed",
    )  # fmt: skip
    RunningAverage(output_transform=lambda o: o["loss"]).attach(trainer, "running_loss")
    evaluator = create_evaluator(
        trainer, lambda m, b: {"token_loss": token_losses(m(b["seq"][:, :-1]), b["seq"])}, placement=placement,
        precision="bf16-mixed",
    )  # fmt: skip
    Perplexity(key="token_loss").attach(evaluator, "perplexity")
    every = Events.ITERATION_COMPLETED(every=size.every)
    Evaluate(evaluator, val).attach(trainer, every)
    saver = Checkpoint({"trainer": trainer}, OrbaxStore(root / "ember"), n_saved=2)
    saver.attach(trainer, every)
    Throughput(every=size.every, tokens=lambda b: b["seq"].shape[0] * (b["seq"].shape[1] - 1)).attach(trainer)
    n = sum(x.size for x in jax.tree.leaves(initial.params))
    return accel.ember_side(trainer, initial, saver, train, size.batch * size.context, [f"{n:,} parameters"])


def hand_side(size: Size, root: Path) -> Side:
    train, val = data(size)
    placement, tx = placement_for(), optimizer(size)
    start = built(size, placement)  # the same parameters, sharded as ember shards them
    graphdef, shardings = start.graphdef, placement.state_shardings(start)
    running_sharding = jax.tree.leaves(shardings.step)[0]
    out = (shardings.params, shardings.opt_state, running_sharding)
    initial = jax.device_get((start.params, tx.init(start.params), jnp.zeros((), jnp.float32)))
    del start

    def forward(params: Any, seq: jax.Array) -> jax.Array:
        bf16 = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
        return nnx.merge(graphdef, bf16)(seq[:, :-1])

    def step(state: Any, batch: Any) -> Any:
        params, opt_state, running = state
        loss, grads = jax.value_and_grad(lambda p: token_losses(forward(p, batch["seq"]), batch["seq"]).mean())(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        running = jnp.where(running == 0, loss, 0.98 * running + 0.02 * loss)
        return (optax.apply_updates(params, updates), opt_state, running), loss

    evaluate = jax.jit(lambda params, batch: token_losses(forward(params, batch["seq"]), batch["seq"]).mean())
    batch_sharding = placement.batch_sharding(False)

    def validate(state: Any) -> None:
        losses = [evaluate(state[0], jax.device_put(b, batch_sharding)) for b in val]
        float(jnp.exp(jnp.mean(jnp.stack(losses))))  # the perplexity, read as a user's log line does

    return accel.hand_side(
        step, initial, out, batch_sharding, train, size.every, validate, lambda s: s[:2], root / "hand",
        size.batch * size.context,
    )  # fmt: skip


def sides(size: Size) -> tuple[list[Side], Path]:
    root = Path(tempfile.mkdtemp(prefix="ember-lm-"))
    return [ember_side(size, root), hand_side(size, root)], root
