"""Workload ``resnet``: a ResNet-18 with batch norm on synthetic images, ember against a hand-written loop.

Flax linen, the ResNet-18 of He et al. (2015) for 224x224 images (four stages of two basic blocks, 64 to 512
channels, batch norm), ``"bf16-mixed"``, SGD with momentum and a cosine decay, data parallel over every device
when there are several. The images are random (nothing is downloaded); 1,000 classes.

ember's side attaches a running average of the loss, an accuracy evaluation and an Orbax checkpoint
every ``every`` steps, ``Throughput``. The hand loop starts from the same parameters and does the same work: one
jitted step with the state donated and the batch sharded, the parameters and images cast to bfloat16 by hand, the
batch statistics updated, the running loss in the step, a jitted accuracy, ``orbax.checkpoint``'s
``StandardCheckpointer``. Keras 3 has no ResNet-18 in ``keras.applications`` (ResNet50 and deeper only), so it is
not beside these two. ``SMOKE`` has one basic block per stage (a ResNet-10 shape), to compile half the network.
"""

from __future__ import annotations

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
from flax import linen as nn

from ember import Events
from ember.checkpoint import OrbaxStore
from ember.handlers import Checkpoint, Evaluate, Throughput
from ember.metrics import Accuracy, RunningAverage
from ember.training import DataParallel, SingleDevice, TrainState, create_evaluator, create_trainer


@dataclass(frozen=True)
class Size:
    image: int
    width: int  # channels of the first stage (64 in ResNet-18)
    blocks: int  # basic blocks per stage (2 in ResNet-18; 1 at smoke size, to compile half the network)
    classes: int
    batch: int
    steps: int
    every: int
    eval_batches: int


FULL = Size(image=224, width=64, blocks=2, classes=1000, batch=128, steps=60, every=30, eval_batches=2)
SMOKE = Size(image=16, width=4, blocks=1, classes=10, batch=4, steps=2, every=2, eval_batches=1)


class BasicBlock(nn.Module):
    channels: int
    stride: int

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        norm = lambda: nn.BatchNorm(use_running_average=not train, momentum=0.9)  # noqa: E731  # two per block
        y = nn.relu(norm()(nn.Conv(self.channels, (3, 3), self.stride, use_bias=False)(x)))
        y = norm()(nn.Conv(self.channels, (3, 3), use_bias=False)(y))
        if self.stride != 1 or x.shape[-1] != self.channels:
            x = norm()(nn.Conv(self.channels, (1, 1), self.stride, use_bias=False)(x))
        return nn.relu(x + y)


class ResNet18(nn.Module):
    width: int
    classes: int
    blocks: int = 2  # per stage

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        x = nn.Conv(self.width, (7, 7), 2, use_bias=False)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(x))
        x = nn.max_pool(x, (3, 3), (2, 2), "SAME")
        for stage in range(4):
            for block in range(self.blocks):
                x = BasicBlock(self.width * 2**stage, 2 if stage and not block else 1)(x, train)
        return nn.Dense(self.classes)(x.mean((1, 2)))


def data(size: Size) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(0)
    shape = (size.batch, size.image, size.image, 3)
    n = min(size.steps, 8)  # a few distinct batches, cycled: the step does not care what the pixels are
    made = [
        {"x": rng.normal(size=shape).astype(np.float32), "y": rng.integers(0, size.classes, size.batch, np.int32)}
        for _ in range(n + size.eval_batches)
    ]
    return [made[i % n] for i in range(size.steps)], made[n:]


def optimizer(size: Size) -> optax.GradientTransformation:
    return optax.sgd(optax.cosine_decay_schedule(0.1, 10 * size.steps), momentum=0.9)


def placement_for() -> Any:
    return DataParallel() if len(jax.devices()) > 1 else SingleDevice()


def _loss(logits: jax.Array, y: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean()


def ember_side(size: Size, root: Path) -> Side:
    train, val = data(size)
    placement, model = placement_for(), ResNet18(size.width, size.classes, size.blocks)
    initial = TrainState.from_linen(model, train[0]["x"][:1], optimizer(size), train_arg="train")
    host = jax.device_get(initial)
    trainer = create_trainer(
        initial, lambda m, b: _loss(m(b["x"]), b["y"]), placement=placement, precision="bf16-mixed"
    )
    RunningAverage(output_transform=lambda o: o["loss"]).attach(trainer, "running_loss")
    evaluator = create_evaluator(
        trainer, lambda m, b: {"y_pred": m(b["x"]), "y": b["y"]}, placement=placement, precision="bf16-mixed"
    )
    Accuracy().attach(evaluator, "accuracy")
    every = Events.ITERATION_COMPLETED(every=size.every)
    Evaluate(evaluator, val).attach(trainer, every)
    saver = Checkpoint({"trainer": trainer}, OrbaxStore(root / "ember"), n_saved=2)
    saver.attach(trainer, every)
    Throughput(every=size.every).attach(trainer)
    n = sum(x.size for x in jax.tree.leaves(host.params))
    return accel.ember_side(trainer, host, saver, train, size.batch, [f"{n:,} parameters"])


def hand_side(size: Size, root: Path) -> Side:
    train, val = data(size)
    placement, model, tx = placement_for(), ResNet18(size.width, size.classes, size.blocks), optimizer(size)
    start = TrainState.from_linen(model, train[0]["x"][:1], tx, train_arg="train")  # ember's very parameters
    state = (start.params, start.model_state["batch_stats"], tx.init(start.params), jnp.zeros(()))
    replicated = placement.state_shardings(state)
    initial = jax.device_get(state)
    bf16 = lambda tree: jax.tree.map(lambda a: a.astype(jnp.bfloat16), tree)  # noqa: E731  # the casts by hand

    def step(state: Any, batch: Any) -> Any:
        params, stats, opt_state, running = state

        def loss(p: Any) -> Any:
            logits, new = model.apply(
                {"params": bf16(p), "batch_stats": stats}, bf16(batch["x"]), train=True, mutable=["batch_stats"]
            )
            kept = jax.tree.map(lambda n, o: n.astype(o.dtype), new["batch_stats"], stats)
            return _loss(logits, batch["y"]), kept

        (value, stats), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        running = jnp.where(running == 0, value, 0.98 * running + 0.02 * value)
        return (optax.apply_updates(params, updates), stats, opt_state, running), value

    def accuracy(state: Any, batch: Any) -> Any:
        logits = model.apply({"params": bf16(state[0]), "batch_stats": state[1]}, bf16(batch["x"]))
        return jnp.sum(jnp.argmax(logits, -1) == batch["y"])

    evaluate = jax.jit(accuracy)
    batch_sharding = placement.batch_sharding(False)

    def validate(state: Any) -> None:
        correct = sum(int(evaluate(state, jax.device_put(b, batch_sharding))) for b in val)
        assert 0 <= correct <= size.batch * len(val)

    return accel.hand_side(
        step, initial, replicated, batch_sharding, train, size.every, validate, lambda s: s[:3], root / "hand",
        size.batch,
    )  # fmt: skip


def sides(size: Size) -> tuple[list[Side], Path]:
    root = Path(tempfile.mkdtemp(prefix="ember-resnet-"))
    return [ember_side(size, root), hand_side(size, root)], root
