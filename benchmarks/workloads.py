"""Realistic workloads: ember with the handlers a user attaches, against a hand-written JAX loop doing the same work.

Workload (a), ``digits``: the digits CNN exactly as ``ember train`` runs it (15 epochs of batches of 64,
AdamW with a cosine schedule and clipping, a running average of the loss, TensorBoard and JSONL logging
every 50 steps, evaluation every epoch with accuracy and loss, the latest and the best checkpoints, a
progress bar), with early stopping off so that both sides run the same epochs. The hand loop uses the
same data, model, optimizer and schedule (ember's CLI builders), a jitted step with the state donated and
the running average computed in it, the same logging through tensorboardX and a JSONL file, a jitted
evaluation, crash-safe ``np.savez`` checkpoints on a writer thread (a temporary folder, fsynced, renamed into
place, the oldest removed: the 2 latest every epoch, the best when it improves; its JSONL log flushed and fsynced
before each, as ``ember train`` syncs its logs) and a
tqdm bar showing the running loss every 10 steps, fetched one refresh late (as ember's bar does). Keras 3
``fit`` on the JAX backend runs the same CNN (``Conv2D`` with "same" padding, ``AveragePooling2D``, dropout),
``AdamW`` with the same cosine decay, weight decay and clipping, the whole batches ember uses, validation in
one batch each epoch, its ``ModelCheckpoint`` for the latest and the best weights, ``CSVLogger``, and the same
TensorBoard scalars through tensorboardX (Keras's own TensorBoard callback needs TensorFlow); it tracks the
training accuracy too (its metrics serve training and validation alike) and draws its own progress bar.
Each run is timed from reading the data to the last checkpoint on disk, as a user waits for it, and reported
three ways: whole, its first epoch (mostly compilation) and the mean of its later epochs (what grows with a
longer run); each side marks an epoch's end where it prints or logs its validation line. The sides alternate,
so drift hits all alike.

Workload (b), ``chars``: the character transformer of ``examples/char_transformer.py`` (its model, data and
optimizer; ten steps per compiled call; 5 epochs), with a running average of the loss, validation perplexity every
epoch (``Evaluate``), a background checkpoint of the latest state every epoch and a line printed per epoch. The
hand loop runs the same ten steps per call as a ``lax.scan``, as a user writes it (looped), the running average in
its step, a jitted evaluation of the mean token loss, the same crash-safe ``np.savez`` on a writer thread.

Workloads ``lm`` and ``resnet``, for accelerators (``_lm.py``, ``_resnet.py``): a ~100 M-parameter GPT-style
NNX decoder and a ResNet-18, each in ``"bf16-mixed"`` with the handlers a user attaches, against a hand-written
JAX loop doing the same work; reported as steps/s, tokens or images/s, MFU, the device's memory peak and the
ratio to the hand loop. ``--smoke`` runs them at a toy size (the test suite does, on CPU, so they never rot); for
digits and chars it skips the warm-up run, so the timings include compilation: a check that they run, not a measure.

Run: ``python benchmarks/workloads.py [--workloads digits,chars] [--repeats N] [--epochs E]`` or
``python benchmarks/workloads.py --workloads lm,resnet [--smoke]``; results in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _accel as accel
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _runs import interleaved

from ember.cli import load_config, train
from ember.cli._registry import build_model, build_optimizer, build_schedule, load_data


def config(epochs: int, output: Path) -> dict[str, Any]:
    # JAX's persistent compilation cache off: it is the process's, and would serve the other sides' compilations too
    # (its cost is measured by first_step.py --cache, in processes of their own)
    trainer = {"max_epochs": epochs, "compilation_cache": None}
    return {"trainer": trainer, "handlers": {"early_stopping": None}, "output": str(output)}


@dataclass(frozen=True)
class Timing:
    """One run's seconds: in all, its first epoch (compilation included), and per later epoch (``None``: one epoch)."""

    total: float
    first: float
    steady: float | None


class EpochClock:
    """Where a side marks each epoch's end: where it prints or logs the epoch's validation line."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.ends: list[float] = []

    def epoch_done(self) -> None:
        self.ends.append(time.perf_counter())

    def timing(self) -> Timing:
        total, ends = time.perf_counter() - self.start, self.ends
        assert ends, "the run marked no epoch's end"
        steady = (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else None
        return Timing(total, ends[0] - self.start, steady)


class EpochLines(io.StringIO):
    """A stream for ``ember train``'s output that marks an epoch's end at each ``epoch ...`` line it prints."""

    def __init__(self, clock: EpochClock) -> None:
        super().__init__()
        self.clock = clock

    def write(self, s: str) -> int:
        if s.startswith("epoch"):
            self.clock.epoch_done()
        return super().write(s)


def timed_in_folder(work: Callable[[Path, EpochClock], object]) -> Timing:
    """How long ``work(folder, clock)`` takes, in a fresh temporary folder removed afterwards."""
    folder = Path(tempfile.mkdtemp())
    try:
        clock = EpochClock()
        work(folder, clock)
        return clock.timing()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def ember_digits(epochs: int) -> Callable[[], Timing]:
    """``ember train`` with the default handlers, in a fresh run folder; returns how long it took."""

    def work(folder: Path, clock: EpochClock) -> None:
        train(config(epochs, folder / "run"), stream=EpochLines(clock), progress_stream=io.StringIO())

    return lambda: timed_in_folder(work)


def _save(folder: Path, tree: Any, keep: int) -> None:
    """The save a careful hand loop makes, as ember's stores do less their checksums and manifest.

    Written into a temporary folder, fsynced, renamed into place (a crash leaves the old checkpoint or the new one,
    whole, never a torn ``state.npz``), the folder fsynced, and the oldest beyond ``keep`` removed.
    """
    tmp = folder.with_name(f".tmp-{folder.name}")
    tmp.mkdir(parents=True)
    with open(tmp / "state.npz", "wb") as f:
        np.savez(f, *[np.asarray(x) for x in jax.tree.leaves(tree)])
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder)
    fd = os.open(folder.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    for old in sorted(folder.parent.glob("step_*"))[:-keep]:
        shutil.rmtree(old)


def hand_digits(epochs: int) -> Callable[[], Timing]:
    """The same run written by hand with jax, optax, tensorboardX and tqdm; returns how long it took."""
    from tensorboardX import SummaryWriter
    from tqdm import tqdm

    def work(folder: Path, clock: EpochClock) -> None:
        best = _hand_run(epochs, folder, SummaryWriter, tqdm, clock)
        assert best > 0  # it trained: some validation accuracy

    return lambda: timed_in_folder(work)


def _hand_run(epochs: int, folder: Path, summary_writer: Any, progress: Any, clock: EpochClock) -> float:
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
        # the running average also leaves as an output of its own, which the bar may keep (the state is donated)
        return (optax.apply_updates(params, updates), opt_state, i + 1, avg, jnp.ones(())), avg

    def evaluate(params: Any, xb: Any, yb: Any) -> Any:
        logits = model.apply({"params": params}, xb)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()
        return jnp.mean(jnp.argmax(logits, -1) == yb), loss

    train_step, eval_step = jax.jit(step, donate_argnums=0), jax.jit(evaluate)
    tb, log = summary_writer(str(folder / "tb")), open(folder / "metrics.jsonl", "a")  # noqa: SIM115
    writer, pending = ThreadPoolExecutor(max_workers=1), None
    bar = progress(total=epochs * steps, file=io.StringIO(), miniters=10)
    best, iteration, shown = -1.0, 0, None
    try:
        for epoch in range(epochs):
            order = np.random.default_rng([seed, epoch]).permutation(len(y))
            for b in range(steps):
                idx = order[b * batch : (b + 1) * batch]
                state, running = train_step(state, x[idx], y[idx])
                iteration += 1
                bar.update(1)
                if iteration % 10 == 0:  # the bar shows the running loss fetched at its previous refresh
                    running.copy_to_host_async()
                    if shown is not None:
                        bar.set_postfix(loss=f"{float(shown):.4g}", refresh=False)
                    shown = running
                if iteration % log_every == 0:
                    loss, lr = float(state[3]), float(schedule(iteration))
                    tb.add_scalar("train/loss", loss, iteration)
                    tb.add_scalar("train/lr", lr, iteration)
                    log.write(json.dumps({"step": iteration, "train/loss": loss, "train/lr": lr}) + "\n")
            accuracy, val_loss = (float(v) for v in eval_step(state[0], val_arrays["x"], val_arrays["y"]))
            tb.add_scalar("val/accuracy", accuracy, iteration)
            tb.add_scalar("val/loss", val_loss, iteration)
            log.write(json.dumps({"step": iteration, "val/accuracy": accuracy, "val/loss": val_loss}) + "\n")
            clock.epoch_done()  # where ember train prints its epoch line
            host = jax.device_get(state)  # the copy the writer saves while training goes on
            if pending is not None:
                pending.result()
            log.flush()  # the records up to this checkpoint on disk before it, as ember train's
            os.fsync(log.fileno())
            pending = _submit(writer, folder / "latest" / f"step_{iteration:08d}", host, keep=2)
            if accuracy > best:
                best = accuracy
                pending.result()
                pending = _submit(writer, folder / "best" / f"step_{iteration:08d}", host, keep=1)
        if pending is not None:
            pending.result()
        jax.block_until_ready(state)
    finally:
        writer.shutdown()
        tb.close()
        log.close()
        bar.close()
    return best


def keras_digits(epochs: int) -> Callable[[], Timing]:
    """The same run with Keras 3 ``fit`` on the JAX backend; returns how long it took."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras
    from tensorboardX import SummaryWriter

    class Scalars(keras.callbacks.Callback):
        """The loss and learning rate every ``every`` steps and the validation metrics each epoch, via tensorboardX."""

        def __init__(self, folder: Path, every: int, schedule: Any) -> None:
            super().__init__()
            self.tb, self.every, self.schedule, self.step = SummaryWriter(str(folder)), every, schedule, 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.step += 1
            if self.step % self.every == 0:
                self.tb.add_scalar("train/loss", float(logs["loss"]), self.step)
                self.tb.add_scalar("train/lr", float(self.schedule(self.step)), self.step)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.tb.add_scalar("val/accuracy", float(logs["val_accuracy"]), self.step)
            self.tb.add_scalar("val/loss", float(logs["val_loss"]), self.step)

        def on_train_end(self, logs: Any = None) -> None:
            self.tb.close()

    class EpochEnds(keras.callbacks.Callback):
        def __init__(self, clock: EpochClock) -> None:
            super().__init__()
            self.clock = clock

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.clock.epoch_done()

    def work(folder: Path, clock: EpochClock) -> None:
        cfg = load_config(config(epochs, folder))
        train_arrays, val_arrays = load_data(cfg.data)
        batch, opt = cfg.data.batch_size, cfg.optimizer
        steps = len(train_arrays["y"]) // batch
        x, y = train_arrays["x"][: steps * batch], train_arrays["y"][: steps * batch]  # whole batches, as ember
        keras.utils.set_random_seed(cfg.trainer.seed)
        layers = keras.layers
        model = keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                layers.Conv2D(16, 3, padding="same", activation="relu"),
                layers.Conv2D(32, 3, padding="same", activation="relu"),
                layers.AveragePooling2D(2),
                layers.Flatten(),
                layers.Dense(64, activation="relu"),
                layers.Dropout(0.1),
                layers.Dense(10),
            ]
        )
        schedule = keras.optimizers.schedules.CosineDecay(opt.learning_rate, epochs * steps)
        optimizer = keras.optimizers.AdamW(schedule, weight_decay=opt.weight_decay, global_clipnorm=opt.clip_norm)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer, loss, metrics=["accuracy"], jit_compile=True)
        callbacks = [
            keras.callbacks.ModelCheckpoint(str(folder / "latest.weights.h5"), save_weights_only=True),
            keras.callbacks.ModelCheckpoint(
                str(folder / "best.weights.h5"),
                monitor="val_accuracy",
                mode="max",
                save_best_only=True,
                save_weights_only=True,
            ),
            keras.callbacks.CSVLogger(str(folder / "metrics.csv")),
            Scalars(folder / "tb", cfg.handlers.log_every, schedule),
            EpochEnds(clock),
        ]
        with contextlib.redirect_stdout(io.StringIO()):  # its progress bar, as ember's and tqdm's go to a buffer
            history = model.fit(
                x,
                y,
                batch_size=batch,
                epochs=epochs,
                shuffle=True,
                callbacks=callbacks,
                validation_data=(val_arrays["x"], val_arrays["y"]),
                validation_batch_size=len(val_arrays["y"]),
            )
        assert max(history.history["val_accuracy"]) > 0  # it trained

    return lambda: timed_in_folder(work)


def _submit(writer: ThreadPoolExecutor, folder: Path, tree: Any, keep: int = 2) -> Future[None]:
    return writer.submit(_save, folder, tree, keep)


def _char_example() -> Any:
    """``examples/char_transformer.py`` as a module (its data, model and loss; nothing runs at import but set-up)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "examples" / "char_transformer.py"
    spec = importlib.util.spec_from_file_location("char_transformer", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ember_chars(epochs: int) -> Callable[[], Timing]:
    """The char transformer with ember: running loss, validation perplexity, a checkpoint and a line per epoch."""
    from ember import Events
    from ember.handlers import Checkpoint, Evaluate
    from ember.metrics import Perplexity, RunningAverage
    from ember.training import TrainState, create_evaluator, create_trainer

    ex = _char_example()

    def work(folder: Path, clock: EpochClock) -> None:
        tx = optax.adamw(3e-3, weight_decay=0.01)
        state = TrainState.from_linen(ex.CharLM(), ex.windows[:1, :-1], tx, seed=0)
        trainer = create_trainer(state, ex.loss_fn, steps_per_call=10)
        RunningAverage(output_transform=lambda o: o["loss"]).attach(trainer, "loss")
        evaluator = create_evaluator(trainer, lambda model, b: {"token_loss": ex.token_losses(model, b)})
        Perplexity(key="token_loss").attach(evaluator, "perplexity")
        saver = Checkpoint({"trainer": trainer}, folder / "latest", n_saved=2)
        log = io.StringIO()

        Evaluate(evaluator, ex.val).attach(trainer)  # its step compiles on another core while the trainer's does

        @trainer.on(Events.EPOCH_COMPLETED)
        def validate(engine: Any) -> None:
            ppl, loss = evaluator.state.metrics["perplexity"], float(engine.state.metrics["loss"])
            print(f"epoch {engine.state.epoch} loss {loss:.4f} val perplexity {ppl:.2f}", file=log)
            clock.epoch_done()

        saver.attach(trainer, Events.EPOCH_COMPLETED)
        trainer.run(ex.train, max_epochs=epochs)

    return lambda: timed_in_folder(work)


def hand_chars(epochs: int) -> Callable[[], Timing]:
    """The same run by hand: a jitted 10-step ``lax.scan``, a jitted evaluation, ``np.savez`` on a thread."""
    ex = _char_example()

    return lambda: timed_in_folder(lambda folder, clock: _hand_chars(ex, epochs, folder, clock))


def _hand_chars(ex: Any, epochs: int, folder: Path, clock: EpochClock) -> None:
    model, tx, k = ex.CharLM(), optax.adamw(3e-3, weight_decay=0.01), 10
    key = jax.random.key(0)
    params = model.init({"params": key}, ex.windows[:1, :-1])["params"]
    state = (params, tx.init(params), jnp.zeros(()), jnp.zeros(()))

    def one(state: Any, seq: Any) -> Any:
        params, opt_state, avg, started = state

        def loss_fn(p: Any) -> Any:
            logits = model.apply({"params": p}, seq[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, seq[:, 1:]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        avg = jnp.where(started > 0, 0.98 * avg + 0.02 * loss, loss)
        return (optax.apply_updates(params, updates), opt_state, avg, jnp.ones(())), loss

    def group(state: Any, seqs: Any) -> Any:
        return jax.lax.scan(one, state, seqs)[0]

    def evaluate(params: Any, seq: Any) -> Any:
        logits = model.apply({"params": params}, seq[:, :-1])
        return jnp.exp(optax.softmax_cross_entropy_with_integer_labels(logits, seq[:, 1:]).mean())

    train_group, train_one, eval_step = (
        jax.jit(group, donate_argnums=0),
        jax.jit(lambda s, b: one(s, b)[0], donate_argnums=0),
        jax.jit(evaluate),
    )
    windows, batch = ex.train.arrays["seq"], ex.train.batch_size
    val = ex.val.arrays["seq"]
    steps = len(windows) // batch
    writer, pending, log = ThreadPoolExecutor(max_workers=1), None, io.StringIO()
    try:
        for epoch in range(epochs):
            order = np.random.default_rng([0, epoch]).permutation(len(windows))
            batches = [windows[order[b * batch : (b + 1) * batch]] for b in range(steps)]
            for g in range(0, steps - steps % k, k):
                state = train_group(state, np.stack(batches[g : g + k]))
            for b in batches[steps - steps % k :]:
                state = train_one(state, b)
            ppl, loss = float(eval_step(state[0], val)), float(state[2])
            print(f"epoch {epoch + 1} loss {loss:.4f} val perplexity {ppl:.2f}", file=log)
            clock.epoch_done()
            host = jax.device_get(state)
            if pending is not None:
                pending.result()
            pending = _submit(writer, folder / "latest" / f"step_{(epoch + 1) * steps:08d}", host)
        if pending is not None:
            pending.result()
    finally:
        writer.shutdown()


WORKLOADS: dict[str, dict[str, Callable[[int], Callable[[], Timing]]]] = {
    "digits": {"ember": ember_digits, "hand loop": hand_digits, "keras fit": keras_digits},
    "chars": {"ember": ember_chars, "hand loop": hand_chars},
}


DEFAULT_EPOCHS = {"digits": 15, "chars": 5}


def measure(workload: str, epochs: int, repeats: int, warm_up: bool = True) -> dict[str, list[Timing]]:
    """Each side's runs, interleaved (the order alternates from one repeat to the next); a warm-up run each first."""
    return interleaved({name: make(epochs) for name, make in WORKLOADS[workload].items()}, repeats, warm_up=warm_up)


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    """``median (min-max)`` of ``values`` times ``scale``."""
    v = [x * scale for x in values]
    return f"{statistics.median(v):.{digits}f} ({min(v):.{digits}f}-{max(v):.{digits}f})"


def speeds(reference: list[float], side: list[float]) -> str:
    """The side's speed against the reference, run by run (``reference / side``), as ``median (min-max)``."""
    return spread([r / s for r, s in zip(reference, side, strict=True)], digits=3)


COLUMNS = (
    "workload | epochs | side | run, s | speed vs the hand loop | first epoch, s | speed vs the hand loop | "
    "each later epoch, ms | speed vs the hand loop"
)


def report(workload: str, epochs: int, times: dict[str, list[Timing]]) -> None:
    """One line per side: each measure as ``median (min-max)`` over the repeats, and its speed against the hand loop."""
    hand = times["hand loop"]
    for name, runs in times.items():
        cells = [workload, str(epochs), name]
        for measure_of, scale in ((lambda t: t.total, 1.0), (lambda t: t.first, 1.0), (lambda t: t.steady, 1e3)):
            values, reference = [measure_of(t) for t in runs], [measure_of(t) for t in hand]
            if None in values or None in reference:
                cells += ["-", "-"]
                continue
            cells += [spread(values, scale), speeds(reference, values)]
        print(" | ".join(cells))
    if "keras fit" in times:
        keras, ember = times["keras fit"], times["ember"]
        whole = speeds([t.total for t in keras], [t.total for t in ember])
        line = f"{workload}: ember's speed vs Keras fit, median (min-max): run {whole}"
        if epochs > 1:
            later = speeds([t.steady for t in keras], [t.steady for t in ember])  # type: ignore[misc]
            line += f", later epochs {later}"
        print(line)


ACCELERATOR = {"lm": ("_lm", "tokens"), "resnet": ("_resnet", "images")}


def accelerator_workload(workload: str, smoke: bool, repeats: int) -> None:
    """Build both sides of ``lm`` or ``resnet``, warm them up, time alternating windows, print the table."""
    import importlib

    name, unit = ACCELERATOR[workload]
    module = importlib.import_module(name)
    size = module.SMOKE if smoke else module.FULL
    sides, root = module.sides(size)
    try:
        print(f"{workload}: {', '.join(sides[0].notes)}; {size}")
        rows = accel.measure(sides, size.steps, repeats, unit)
        print(accel.table(workload, rows, unit, size.steps))
        print(json.dumps({workload: {k: {n: v for n, v in r.items() if n != "seconds"} for k, r in rows.items()}}))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    known = sorted([*WORKLOADS, *ACCELERATOR])
    parser.add_argument("--workloads", default="digits,chars", help=f"comma-separated, of {known}")
    parser.add_argument("--epochs", type=int, default=None, help=f"epochs per run; default {DEFAULT_EPOCHS}")
    parser.add_argument("--repeats", type=int, default=None, help="runs (windows for lm, resnet) per side; 5 (3)")
    parser.add_argument(
        "--smoke", action="store_true", help="to check they run: lm and resnet at a toy size, no warm-up run before"
    )
    args = parser.parse_args(argv)
    unknown = [w for w in args.workloads.split(",") if w not in known]
    if unknown:
        parser.error(f"unknown workload {unknown[0]!r}; the workloads are {known}")
    chosen = args.workloads.split(",")
    if any(w in WORKLOADS for w in chosen):
        repeats = args.repeats or 5
        print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {repeats} repeats; each cell: median (min-max)")
        print(COLUMNS)
    for workload in chosen:
        if workload in ACCELERATOR:
            accelerator_workload(workload, args.smoke, args.repeats or (1 if args.smoke else 3))
        else:
            epochs = args.epochs or DEFAULT_EPOCHS[workload]
            report(workload, epochs, measure(workload, epochs, args.repeats or 5, warm_up=not args.smoke))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
