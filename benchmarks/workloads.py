"""Realistic workloads: ember with the handlers a user attaches, against a hand-written JAX loop doing the same work.

Workload (a), ``digits``: the digits CNN exactly as ``ember train`` runs it (15 epochs of batches of 64,
AdamW with a cosine schedule and clipping, a running average of the loss, TensorBoard and JSONL logging
every 50 steps, evaluation every epoch with accuracy and loss, the latest and the best checkpoints, a
progress bar), with early stopping off so that both sides run the same epochs. The hand loop uses the
same data, model, optimizer and schedule (ember's CLI builders), a jitted step with the state donated and
the running average computed in it, the same logging through tensorboardX and a JSONL file, a jitted
evaluation, ``np.savez`` checkpoints on a writer thread (latest every epoch, best when it improves) and a
tqdm bar. Each run is timed whole, from reading the data to the last checkpoint on disk, as a user waits
for it; the two alternate, so drift hits both alike.

Run: ``python benchmarks/workloads.py [--repeats N] [--epochs E]``; results in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ember.cli import load_config, train
from ember.cli._registry import build_model, build_optimizer, build_schedule, load_data


def config(epochs: int, output: Path) -> dict[str, Any]:
    return {"trainer": {"max_epochs": epochs}, "handlers": {"early_stopping": None}, "output": str(output)}


def ember_digits(epochs: int) -> Callable[[], float]:
    """``ember train`` with the default handlers, in a fresh run folder; returns the seconds it took."""

    def run() -> float:
        folder = Path(tempfile.mkdtemp())
        try:
            start = time.perf_counter()
            train(config(epochs, folder / "run"), stream=io.StringIO(), progress_stream=io.StringIO())
            return time.perf_counter() - start
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    return run


def _save(folder: Path, tree: Any) -> None:
    folder.mkdir(parents=True)
    np.savez(folder / "state.npz", *[np.asarray(x) for x in jax.tree.leaves(tree)])


def hand_digits(epochs: int) -> Callable[[], float]:
    """The same run written by hand with jax, optax, tensorboardX and tqdm; returns the seconds it took."""
    from tensorboardX import SummaryWriter
    from tqdm import tqdm

    def run() -> float:
        folder = Path(tempfile.mkdtemp())
        try:
            start = time.perf_counter()
            seconds = _hand_run(epochs, folder, SummaryWriter, tqdm)
            assert seconds > 0
            return time.perf_counter() - start
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    return run


def _hand_run(epochs: int, folder: Path, summary_writer: Any, progress: Any) -> float:
    cfg = load_config(config(epochs, folder))
    train_arrays, val_arrays = load_data(cfg.data)
    x, y = train_arrays["x"], train_arrays["y"]
    batch, log_every, seed = cfg.data.batch_size, cfg.handlers.log_every, cfg.data.seed
    steps = len(y) // batch
    schedule = build_schedule(cfg.optimizer, epochs * steps)
    tx = build_optimizer(cfg.optimizer, schedule)
    model = build_model(cfg.model)
    key = jax.random.key(cfg.trainer.seed)
    params = model.init({"params": key}, x[:1])["params"]
    state = (params, tx.init(params), jnp.zeros((), jnp.int32), jnp.zeros(()), jnp.zeros(()))

    def step(state: Any, xb: Any, yb: Any) -> Any:
        params, opt_state, i, avg, started = state

        def loss_fn(p: Any) -> Any:
            logits = model.apply({"params": p}, xb, train=True, rngs={"dropout": jax.random.fold_in(key, i)})
            return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        avg = jnp.where(started > 0, 0.98 * avg + 0.02 * loss, loss)
        return optax.apply_updates(params, updates), opt_state, i + 1, avg, jnp.ones(())

    def evaluate(params: Any, xb: Any, yb: Any) -> Any:
        logits = model.apply({"params": params}, xb)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()
        return jnp.mean(jnp.argmax(logits, -1) == yb), loss

    train_step, eval_step = jax.jit(step, donate_argnums=0), jax.jit(evaluate)
    tb, log = summary_writer(str(folder / "tb")), open(folder / "metrics.jsonl", "a")  # noqa: SIM115
    writer, pending = ThreadPoolExecutor(max_workers=1), None
    bar = progress(total=epochs * steps, file=io.StringIO(), miniters=10)
    best, iteration = -1.0, 0
    try:
        for epoch in range(epochs):
            order = np.random.default_rng([seed, epoch]).permutation(len(y))
            for b in range(steps):
                idx = order[b * batch : (b + 1) * batch]
                state = train_step(state, x[idx], y[idx])
                iteration += 1
                bar.update(1)
                if iteration % log_every == 0:
                    loss, lr = float(state[3]), float(schedule(iteration))
                    tb.add_scalar("train/loss", loss, iteration)
                    tb.add_scalar("train/lr", lr, iteration)
                    log.write(json.dumps({"step": iteration, "train/loss": loss, "train/lr": lr}) + "\n")
            accuracy, val_loss = (float(v) for v in eval_step(state[0], val_arrays["x"], val_arrays["y"]))
            tb.add_scalar("val/accuracy", accuracy, iteration)
            tb.add_scalar("val/loss", val_loss, iteration)
            log.write(json.dumps({"step": iteration, "val/accuracy": accuracy, "val/loss": val_loss}) + "\n")
            host = jax.device_get(state)  # the copy the writer saves while training goes on
            if pending is not None:
                pending.result()
            pending = _submit(writer, folder / "latest" / f"step_{iteration:08d}", host)
            if accuracy > best:
                best = accuracy
                pending.result()
                pending = _submit(writer, folder / "best" / f"step_{iteration:08d}", host)
        if pending is not None:
            pending.result()
        jax.block_until_ready(state)
    finally:
        writer.shutdown()
        tb.close()
        log.close()
        bar.close()
    return best


def _submit(writer: ThreadPoolExecutor, folder: Path, tree: Any) -> Future[None]:
    return writer.submit(_save, folder, tree)


WORKLOADS: dict[str, dict[str, Callable[[int], Callable[[], float]]]] = {
    "digits": {"ember": ember_digits, "hand loop": hand_digits},
}


def measure(workload: str, epochs: int, repeats: int) -> dict[str, list[float]]:
    """Seconds per run of each side, interleaved (the order alternates from one repeat to the next)."""
    sides = {name: make(epochs) for name, make in WORKLOADS[workload].items()}
    for run in sides.values():  # warm-up: imports, first compilations of library code
        run()
    times: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(repeats):
        names = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in names:
            times[name].append(sides[name]())
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="digits", help=f"comma-separated, of {sorted(WORKLOADS)}")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    unknown = [w for w in args.workloads.split(",") if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload {unknown[0]!r}; the workloads are {sorted(WORKLOADS)}")
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {args.epochs} epochs, {args.repeats} repeats")
    print("workload | side | seconds per run (median, min-max) | speed vs the hand loop (median, min-max)")
    for workload in args.workloads.split(","):
        times = measure(workload, args.epochs, args.repeats)
        hand = times["hand loop"]
        for name, seconds in times.items():
            ratios = [h / s for h, s in zip(hand, seconds, strict=True)]
            print(
                f"{workload} | {name} | {statistics.median(seconds):.2f} ({min(seconds):.2f}-{max(seconds):.2f}) | "
                f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
