"""The character transformer, sharded: FSDP and tensor parallelism from the model's own logical axis names.

Every kernel names its axes (``embed``, ``mlp``, ``heads``, ``kv``, ``vocab``) with
``nn.with_logical_partitioning``; ``logical_rules`` map them onto a ``("fsdp", "model")`` mesh: the
embedding dimension is split over ``fsdp`` (each device holds a part of every matrix, as in FSDP), the MLP's
hidden units and the attention heads over ``model`` (tensor parallel). The batch is split over ``fsdp``. The
state is built already sharded, and the run prints where each kernel went and how much of the state each
device holds.

On a CPU-only machine the script asks XLA for 8 simulated devices (a 4 x 2 mesh); on a GPU machine it uses
the real devices, unchanged. Run: ``python examples/sharded_transformer.py [EPOCHS]``
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# 8 simulated CPU devices (unless XLA_FLAGS names a count); set before JAX starts
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=8"

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from jax.sharding import Mesh

from ember import Events
from ember.data import ArrayDataset
from ember.metrics import Perplexity
from ember.training import Sharded, TrainState, create_evaluator, create_trainer

CONTEXT, WIDTH, HEADS, LAYERS = 64, 96, 4, 2
LOGICAL_RULES = (("embed", "fsdp"), ("mlp", "model"), ("heads", "model"), ("kv", None), ("vocab", None))

STDLIB = Path(os.__file__).parent
text = b"".join((STDLIB / name).read_bytes() for name in ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py"))
tokens = np.frombuffer(text, np.uint8).astype(np.int32)
windows = tokens[: len(tokens) // (CONTEXT + 1) * (CONTEXT + 1)].reshape(-1, CONTEXT + 1)
split = int(len(windows) * 0.9)
train = ArrayDataset({"seq": windows[:split]}, batch_size=32, shuffle=True, seed=0, drop_remainder=True)
val = ArrayDataset({"seq": windows[split:][:64]}, batch_size=64)


def named(*names: str | None) -> nn.initializers.Initializer:
    return nn.with_logical_partitioning(nn.initializers.lecun_normal(), names)


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        attention = nn.MultiHeadDotProductAttention(
            HEADS, kernel_init=named("embed", "heads", "kv"), out_kernel_init=named("heads", "kv", "embed")
        )
        x = x + attention(nn.LayerNorm()(x), mask=mask)
        h = nn.gelu(nn.Dense(4 * WIDTH, kernel_init=named("embed", "mlp"))(nn.LayerNorm()(x)))
        return x + nn.Dense(WIDTH, kernel_init=named("mlp", "embed"))(h)


class CharLM(nn.Module):
    @nn.compact
    def __call__(self, seq):
        embed = nn.Embed(
            256, WIDTH, embedding_init=nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed"))
        )
        x = embed(seq) + self.param("pos", nn.initializers.normal(0.02), (CONTEXT, WIDTH))
        for _ in range(LAYERS):
            x = Block()(x)
        return nn.Dense(256, kernel_init=named("embed", "vocab"))(nn.LayerNorm()(x))


def token_losses(model, batch):
    inputs, targets = batch["seq"][:, :-1], batch["seq"][:, 1:]
    return optax.softmax_cross_entropy_with_integer_labels(model(inputs), targets)


devices = np.array(jax.devices())
model_size = 2 if len(devices) % 2 == 0 else 1
mesh = Mesh(devices.reshape(len(devices) // model_size, model_size), ("fsdp", "model"))
placement = Sharded(mesh, logical_rules=LOGICAL_RULES)
state = TrainState.from_linen(CharLM(), windows[:1, :-1], optax.adamw(3e-3, weight_decay=0.01), placement=placement)
trainer = create_trainer(state, lambda model, b: token_losses(model, b).mean(), placement=placement)
evaluator = create_evaluator(trainer, lambda model, b: {"token_loss": token_losses(model, b)}, placement=placement)
Perplexity(key="token_loss").attach(evaluator, "perplexity")


@trainer.on(Events.EPOCH_COMPLETED)
def validate(engine):
    evaluator.run(val)
    print(f"epoch {engine.state.epoch}  val perplexity {evaluator.state.metrics['perplexity']:.2f}", flush=True)


if __name__ == "__main__":
    params = trainer.state.train_state.params
    print(f"{placement!r} over {len(devices)} {devices[0].platform} devices")
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if "Block_0" in jax.tree_util.keystr(path) or "Embed" in jax.tree_util.keystr(path):
            print(f"  {jax.tree_util.keystr(path):58s} {leaf.shape!s:14s} {leaf.sharding.spec}")
    leaves = jax.tree.leaves((params, trainer.state.train_state.opt_state))
    held = max(sum(s.data.nbytes for x in leaves for s in x.addressable_shards if s.device == d) for d in devices.flat)
    print(f"params + optimizer state: {sum(x.nbytes for x in leaves):,} bytes; at most {held:,} on one device")
    trainer.run(train, max_epochs=int(sys.argv[1]) if len(sys.argv) > 1 else 2)
