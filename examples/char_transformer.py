"""A character-level transformer language model, trained on Python's own standard library source code.

The text is the source of a few standard-library modules (it ships with every Python; nothing is
downloaded), as bytes: a 256-symbol vocabulary. A two-layer causal transformer learns to predict the next
byte; ten steps run per compiled call (``steps_per_call=10``), and validation perplexity (``Perplexity``
over per-token losses, accumulated on device) is reported every epoch. A model that knew nothing would
score 256; the trained one should reach single digits in well under a minute on two CPU cores.

Run: ``python examples/char_transformer.py``
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from ember import Events
from ember.data import ArrayDataset
from ember.metrics import Perplexity
from ember.training import TrainState, create_evaluator, create_trainer

CONTEXT, WIDTH, HEADS, LAYERS = 64, 96, 4, 2
STDLIB = Path(os.__file__).parent
text = b"".join((STDLIB / name).read_bytes() for name in ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py"))
tokens = np.frombuffer(text, np.uint8).astype(np.int32)
windows = tokens[: len(tokens) // (CONTEXT + 1) * (CONTEXT + 1)].reshape(-1, CONTEXT + 1)
split = int(len(windows) * 0.9)
train = ArrayDataset({"seq": windows[:split]}, batch_size=32, shuffle=True, seed=0, drop_remainder=True)
val = ArrayDataset({"seq": windows[split:]}, batch_size=len(windows) - split)


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        x = x + nn.MultiHeadDotProductAttention(HEADS)(nn.LayerNorm()(x), mask=mask)
        h = nn.gelu(nn.Dense(4 * WIDTH)(nn.LayerNorm()(x)))
        return x + nn.Dense(WIDTH)(h)


class CharLM(nn.Module):
    @nn.compact
    def __call__(self, seq):
        x = nn.Embed(256, WIDTH)(seq) + self.param("pos", nn.initializers.normal(0.02), (CONTEXT, WIDTH))
        for _ in range(LAYERS):
            x = Block()(x)
        return nn.Dense(256)(nn.LayerNorm()(x))


def token_losses(model, batch):
    inputs, targets = batch["seq"][:, :-1], batch["seq"][:, 1:]
    return optax.softmax_cross_entropy_with_integer_labels(model(inputs), targets)


def loss_fn(model, batch):
    return token_losses(model, batch).mean()


state = TrainState.from_linen(CharLM(), windows[:1, :-1], optax.adamw(3e-3, weight_decay=0.01), seed=0)
trainer = create_trainer(state, loss_fn, steps_per_call=10)
evaluator = create_evaluator(trainer, lambda model, b: {"token_loss": token_losses(model, b)})
Perplexity(key="token_loss").attach(evaluator, "perplexity")


@trainer.on(Events.EPOCH_COMPLETED)
def validate(engine):
    evaluator.run(val)
    print(
        f"epoch {engine.state.epoch}  iteration {engine.state.iteration:4d}  "
        f"val perplexity {evaluator.state.metrics['perplexity']:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    print(f"{len(text):,} bytes of standard-library source, {len(windows):,} windows of {CONTEXT + 1}")
    trainer.run(train, max_epochs=int(sys.argv[1]) if len(sys.argv) > 1 else 8)
