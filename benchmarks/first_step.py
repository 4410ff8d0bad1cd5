"""Time to first step: a fresh process training the digits CNN with ember, against the same by hand.

Each side runs in a new Python process, as a user's script does: it imports what it needs, loads the digits,
builds the model's state, compiles the train step and finishes one step. The time runs from launching the
process to that step's result being ready. Both sides share the data preparation, the Flax CNN and the loss
below (which import neither ember nor anything the other side does not). ember's side builds a
``TrainState`` with ``TrainState.from_linen`` and runs ``create_trainer(...).run(data, max_iters=1)``; the hand
side calls ``model.init``, ``optax.adamw(...).init`` and a ``jax.jit`` step with the state donated.
JAX's persistent compilation cache is off in both, so each compiles from scratch. Processes alternate.

With ``--cli``, the ``ember`` command's answers that need no training, each against ``python -c pass`` (the
interpreter's own start) in the same loop: ``ember --version``, a config typo, and the relaunch of a finished run
(``python -X importtime`` shows what each imports; none imports JAX); and, for scale, the whole default digits run
(``ember train``, 15 epochs, from launch to exit), the figure the CLI page quotes.

With ``--cache``, what JAX's persistent compilation cache (``trainer.compilation_cache``, on by default in ``ember
train``) costs and saves: a one-epoch digits run from launch to exit with the cache off, with an empty cache (the
first run of a folder: it writes each entry) and with the cache a first run filled (a relaunch: it reads them),
alternating, in fresh processes (the cache's folder is a process's, fixed by its first compilation).

Run: ``python benchmarks/first_step.py [--repeats N] [--cli | --cache]``; results in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable


def shared() -> tuple[object, object, object]:
    """The data (a list of batches of 64), the CNN and the loss of the logits: what both sides run."""
    import flax.linen as nn
    import numpy as np
    import optax
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images[..., None] / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    batches = [{"x": x[i : i + 64], "y": y[i : i + 64]} for i in range(0, len(y) - 63, 64)]

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            x = nn.relu(nn.Conv(16, (3, 3))(x))
            x = nn.relu(nn.Conv(32, (3, 3))(x))
            x = nn.Dropout(0.1, deterministic=not train)(x.reshape((x.shape[0], -1)))
            return nn.Dense(10)(nn.relu(nn.Dense(64)(x)))

    def loss(logits, y):
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    return batches, CNN(), loss


def ember_side() -> None:
    import optax

    from ember.training import TrainState, create_trainer

    batches, model, loss = shared()
    state = TrainState.from_linen(model, batches[0]["x"], optax.adamw(1e-3), seed=0, rngs=("dropout",))
    trainer = create_trainer(state, lambda m, b: loss(m(b["x"]), b["y"]))  # ember passes train=True
    trainer.run(batches, max_iters=1)
    trainer.state.train_state.step.block_until_ready()


def hand_side() -> None:
    import jax
    import optax

    batches, model, loss = shared()
    key = jax.random.key(0)
    params = model.init({"params": key}, batches[0]["x"])["params"]  # type: ignore[attr-defined]
    tx = optax.adamw(1e-3)

    def step(state, batch):
        params, opt_state, i = state

        def loss_of(p):
            logits = model.apply({"params": p}, batch["x"], train=True, rngs={"dropout": jax.random.fold_in(key, i)})  # type: ignore[attr-defined]
            return loss(logits, batch["y"])  # type: ignore[operator]

        value, grads = jax.value_and_grad(loss_of)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, i + 1), value

    state, _ = jax.jit(step, donate_argnums=0)((params, tx.init(params), 0), batches[0])
    jax.block_until_ready(state)


def launch(side: str) -> float:
    """Seconds from starting a fresh process to its first step being done."""
    env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false", "JAX_COMPILATION_CACHE_DIR": ""}
    start = time.time()
    out = subprocess.run(
        [sys.executable, __file__, "--side", side], env=env, capture_output=True, text=True, check=True, timeout=300
    )
    return float(out.stdout.split()[-1]) - start


def timed_commands(
    commands: dict[str, Callable[[], list[str]]], repeats: int, *, env: dict[str, str] | None = None, check: bool = True
) -> dict[str, list[float]]:
    """Seconds from launch to exit of ``python <commands[name]()>`` for each name, ``repeats`` times, alternating."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for r in range(repeats):
        for name in list(commands) if r % 2 == 0 else list(reversed(commands)):
            args = commands[name]()
            start = time.perf_counter()
            subprocess.run([sys.executable, *args], env=env, capture_output=True, check=check, timeout=300)
            times[name].append(time.perf_counter() - start)
    return times


def report(title: str, times: dict[str, list[float]], reference: str, against: Callable[[float, float], str]) -> None:
    """Print each command's median, range, and ``against(median, the reference's median)``."""
    ref = statistics.median(times[reference])
    print(title)
    for name, values in times.items():
        median = statistics.median(values)
        print(
            f"{name:20s} median {median:.2f} s (min {min(values):.2f}, max {max(values):.2f}), {against(median, ref)}"
        )


def cli_answers(repeats: int) -> None:
    """Seconds for the ``ember`` command's quick answers, against a bare interpreter's start, alternating."""
    import tempfile

    run = os.path.join(tempfile.mkdtemp(), "run")
    quick = ["trainer.max_epochs=1", "handlers.progress=false", "handlers.writers=[jsonl]"]
    subprocess.run([sys.executable, "-m", "ember.cli", "train", "--output", run, *quick], check=True, timeout=300)
    commands = {
        "python -c pass": ["-c", "pass"],
        "ember --version": ["-m", "ember.cli", "--version"],
        "a config typo": ["-m", "ember.cli", "train", "trainer.max_epoch=3"],
        "a finished run": ["-m", "ember.cli", "train", "--output", run, *quick],
        "the digits run": ["-m", "ember.cli", "train", "handlers.progress=false", "--output"],  # a new folder each
    }
    times = timed_commands(
        {
            name: lambda a=args, n=name: a + ([tempfile.mkdtemp()] if n == "the digits run" else [])
            for name, args in commands.items()
        },
        repeats,
        check=False,
    )
    report(f"{repeats} repeats, seconds from launch to exit", times, "python -c pass", lambda m, ref: f"{m / ref:.1f}x")


def cache_costs(repeats: int) -> None:
    """Seconds of a one-epoch ``ember train`` with the compilation cache off, empty, and filled, alternating."""
    import tempfile

    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    quick = ["-m", "ember.cli", "train", "trainer.max_epochs=1", "handlers.progress=false", "--output"]
    filled = tempfile.mkdtemp()
    fill = [sys.executable, *quick, tempfile.mkdtemp(), f"trainer.compilation_cache={filled}"]
    subprocess.run(fill, env=env, capture_output=True, check=True, timeout=300)
    caches = {"off": lambda: "null", "empty (a first run)": tempfile.mkdtemp, "filled (a relaunch)": lambda: filled}
    times = timed_commands(
        {
            name: lambda c=cache: [*quick, tempfile.mkdtemp(), f"trainer.compilation_cache={c()}"]
            for name, cache in caches.items()
        },
        repeats,
        env=env,
    )
    title = f"{repeats} repeats, seconds from launch to exit of a one-epoch digits run, by compilation cache"
    report(title, times, "off", lambda m, ref: f"{m - ref:+.2f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--cli", action="store_true", help="the ember command's answers without training")
    parser.add_argument("--cache", action="store_true", help="what the persistent compilation cache costs and saves")
    parser.add_argument("--side", choices=["ember", "hand"], help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args(argv)
    if args.cli:
        cli_answers(args.repeats)
        return
    if args.cache:
        cache_costs(args.repeats)
        return
    if args.side is not None:
        ember_side() if args.side == "ember" else hand_side()
        print(time.time())
        return
    times: dict[str, list[float]] = {"hand loop": [], "ember": []}
    for r in range(args.repeats):
        for name in list(times) if r % 2 == 0 else list(reversed(times)):
            times[name].append(launch("hand" if name == "hand loop" else "ember"))
    hand = statistics.median(times["hand loop"])
    print(f"{args.repeats} repeats, seconds from launch to the first step done")
    for name, values in times.items():
        median = statistics.median(values)
        line = f"{name:10s} median {median:.2f} s (min {min(values):.2f}, max {max(values):.2f})"
        if name != "hand loop":
            line += f"  {100 * (median / hand - 1):+.1f}% over the hand loop"
        print(line)


if __name__ == "__main__":
    main()
