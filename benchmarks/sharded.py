"""Sharded training: ember's FSDP trainer against a hand-written ``jit`` + ``NamedSharding`` loop; memory per device.

The model is an MLP of four 1024-wide layers (about 3.2 M parameters) with Adam, batches of 64. Both sides
shard the same way (ember's ``fsdp()`` rule: each matrix split along its largest dimension over every
device); the hand loop builds its state with ``jax.jit(init, out_shardings=...)``, places each batch with
``jax.device_put`` and calls a jitted step with the state donated, as the JAX sharding guide does. The
two alternate, so drift hits both alike. The memory table sums each device's shards of params and
optimizer state, replicated (``DataParallel``) against FSDP.

On a CPU-only machine the script asks XLA for 8 simulated devices; on an accelerator it uses the real ones.
Run: ``python benchmarks/sharded.py [--steps N] [--repeats R]``; results in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):  # CPU only; before JAX starts
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".lstrip()

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
from _runs import interleaved
from flax import linen as nn

from ember.training import DataParallel, TrainState, create_trainer, fsdp

WIDTH, DEPTH, BATCH = 1024, 4, 64


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x: Any) -> Any:
        for _ in range(DEPTH - 1):
            x = nn.relu(nn.Dense(WIDTH)(x))
        return nn.Dense(10)(x)


def loss_fn(model: Any, batch: Any) -> Any:
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()


def data(steps: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        {"x": rng.normal(size=(BATCH, WIDTH)).astype(np.float32), "y": rng.integers(0, 10, BATCH).astype(np.int32)}
        for _ in range(steps)
    ]


def ember_side(batches: list[Any]) -> Callable[[], float]:
    placement = fsdp()
    state = TrainState.from_linen(MLP(), batches[0]["x"][:1], optax.adam(1e-3), placement=placement)
    trainer = create_trainer(state, loss_fn, placement=placement)
    trainer.run(batches[:2], max_epochs=1)  # compile

    def run() -> float:
        start = time.perf_counter()
        trainer.run(batches, max_epochs=1)
        jax.block_until_ready(trainer.state.train_state)
        return len(batches) / (time.perf_counter() - start)

    return run


def hand_side(batches: list[Any]) -> Callable[[], float]:
    """The JAX sharding guide's loop, with ember's shardings for the same model."""
    model, tx, placement = MLP(), optax.adam(1e-3), fsdp()

    def init() -> Any:
        params = model.init(jax.random.key(0), batches[0]["x"][:1])["params"]
        return params, tx.init(params)

    abstract = TrainState.from_linen(model, batches[0]["x"][:1], tx)  # only for the shardings' shapes
    shardings = placement.state_shardings(abstract)
    state = jax.jit(init, out_shardings=(shardings.params, shardings.opt_state))()
    batch_sharding = placement.batch_sharding(False)

    def step(state: Any, batch: Any) -> Any:
        params, opt_state = state

        def loss(p: Any) -> Any:
            logits: Any = model.apply({"params": p}, batch["x"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), value

    compiled = jax.jit(step, donate_argnums=0, out_shardings=((shardings.params, shardings.opt_state), shardings.step))
    holder = [state]

    def run() -> float:
        start = time.perf_counter()
        s = holder[0]
        for b in batches:
            s, _ = compiled(s, jax.device_put(b, batch_sharding))
            if jax.devices()[0].platform == "cpu":  # as ember does on XLA:CPU: one multi-device program at a time
                jax.block_until_ready(s)
        jax.block_until_ready(s)
        holder[0] = s
        return len(batches) / (time.perf_counter() - start)

    run()  # compile
    return run


def per_device_bytes(tree: Any) -> int:
    held: dict[int, int] = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            held[shard.device.id] = held.get(shard.device.id, 0) + shard.data.nbytes
    return max(held.values())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    devices = jax.devices()
    print(f"jax {jax.__version__}, {len(devices)} {devices[0].platform} devices, MLP {DEPTH}x{WIDTH}, batch {BATCH}")
    batches = data(args.steps)
    sides = {"hand jit + NamedSharding": hand_side(batches), "ember fsdp()": ember_side(batches)}
    rates = interleaved(sides, args.repeats)
    hand = rates["hand jit + NamedSharding"]
    for name, values in rates.items():
        ratios = [v / h for v, h in zip(values, hand, strict=True)]
        print(
            f"{name:26s} {statistics.median(values):8.1f} steps/s  "
            f"{statistics.median(ratios):.3f} x hand (range {min(ratios):.3f}-{max(ratios):.3f})"
        )
    for name, placement in (("replicated (DataParallel)", DataParallel()), ("FSDP (fsdp())", fsdp())):
        state = TrainState.from_linen(MLP(), batches[0]["x"][:1], optax.adam(1e-3), placement=placement)
        state = placement.put_state(state)
        tree = (state.params, state.opt_state)
        total = sum(x.nbytes for x in jax.tree.leaves(tree))
        fullest = per_device_bytes(tree) / 2**20
        print(
            f"{name:26s} params + Adam state: {total / 2**20:6.1f} MiB in all, {fullest:6.2f} MiB on the fullest device"
        )


if __name__ == "__main__":
    main()
