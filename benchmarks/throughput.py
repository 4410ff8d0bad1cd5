"""Training throughput: steps per second of the ember trainer beside hand-written JAX loops, in one process.

Two models on synthetic float32 data with Adam: a tiny MLP 784-32-10 with batch 32 (where Python overhead
shows) and an MLP 784-512-512-10 with batch 128. Rows, each the best of ``--repeats`` interleaved runs:

- ``hand loop``: ``jax.jit`` with the state donated, no host sync until the end; the reference;
- ``ember``: ``create_trainer`` with no handlers;
- ``ember + handlers``: a typical set: a ``RunningAverage`` of the loss (on device) shown by a
  ``ProgressBar`` refreshed every 100 iterations (drawing to ``os.devnull``), and epoch-level loss and
  accuracy metrics;
- ``ember, aux outputs`` and ``ember + metrics``: the step also returns logits and labels; the second row
  attaches ``Average`` of the loss, ``Accuracy`` and a ``RunningAverage`` of the loss, so the ratio between
  the two is what the metrics cost (their updates fold into the compiled step);
- ``hand loop, aux outputs`` and ``hand loop + metrics in its step``: the same two rows written by hand,
  the metrics as six scalar accumulators carried and updated in the jitted step (as a hand-written loop
  or a Flax NNX ``MultiMetric`` keeps them), so ember's metric cost can be read beside a hand-written one;
- ``hand scan x10``, ``ember steps_per_call=10`` and ``ember steps_per_call=10 + handlers`` (the typical
  set above): ten steps per compiled call (``lax.scan``);
- ``keras fit`` and ``keras fit, steps_per_execution=10``: Keras 3 on the JAX backend, when installed
  (``pip install keras``; it is not a dependency).

Every row consumes the same host (NumPy) batches and ends with ``block_until_ready``. Rows run interleaved;
the rate shown is the best run, and each ratio is the median over repeats of the ratio measured within one
repeat (row against its reference run moments apart), which is far steadier on a busy machine than a ratio
of bests.

Run: ``python benchmarks/throughput.py [--repeats R] [--quick] [--models tiny,512] [--rows ROWS] [--steps N]``;
``--rows "ember + metrics,hand loop + metrics in its step"`` runs those rows and their references only
(many short repeats of a few rows resolve a few per cent better than the whole table).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _runs import attach_metrics, timed_runs
from flax import linen as nn

from ember.handlers import ProgressBar
from ember.training import SingleDevice, TrainState, create_trainer


def keras_or_none() -> Any:
    """Keras 3 where installed, imported when first asked for (a wrong argument is answered without it); else None."""
    try:
        import keras
    except ImportError:
        return None
    return keras


class MLP(nn.Module):
    hidden: tuple[int, ...]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for h in self.hidden:
            x = nn.relu(nn.Dense(h)(x))
        return nn.Dense(10)(x)


def loss_fn(model: Any, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    x, y = batch
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def loss_with_outputs(model: Any, batch: tuple[jax.Array, jax.Array]) -> Any:
    x, y = batch
    logits = model(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), {"y_pred": logits, "y": y}


def make_data(n: int, batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        (rng.normal(size=(batch, 784)).astype(np.float32), rng.integers(0, 10, size=batch).astype(np.int32))
        for _ in range(n)
    ]


def fresh_state(hidden: tuple[int, ...]) -> TrainState:
    return TrainState.from_linen(MLP(hidden), jnp.ones((1, 784)), optax.adam(1e-3), seed=0)


def hand_loop(
    hidden: tuple[int, ...], data: list[Any], *, aux: bool = False, metrics: bool = False
) -> Callable[[], float]:
    """The hand-written loop; ``aux``: the step also returns logits and labels; ``metrics``: and updates metrics.

    With ``metrics`` the step keeps the three metrics of the "ember + metrics" row the way a hand-written
    loop (or a Flax NNX ``MultiMetric``) keeps them: six scalar accumulators in the carried state (loss sum
    and count, correct predictions and count, running average and a started flag), updated in the step,
    with the running average returned every step.
    """
    module, tx = MLP(hidden), optax.adam(1e-3)
    zeros = (np.float32(0), np.int32(0), np.int32(0), np.int32(0), np.float32(0), np.float32(0))

    @jax.jit
    def init() -> Any:
        params = module.init(jax.random.PRNGKey(0), jnp.ones((1, 784)))["params"]
        return params, tx.init(params), tuple(jnp.asarray(z) for z in zeros) if metrics else ()

    def loss(params: Any, x: jax.Array, y: jax.Array) -> Any:
        logits = module.apply({"params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), logits

    def step(carry: Any, x: jax.Array, y: jax.Array) -> Any:
        params, opt_state, acc = carry
        (value, logits), grads = jax.value_and_grad(loss, has_aux=True)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        out = (value, logits, y) if aux or metrics else value
        if metrics:
            total, seen, correct, counted, average, started = acc
            n = y.shape[0]
            average = jnp.where(started > 0, 0.98 * average + 0.02 * value, value)
            hits = jnp.sum(jnp.argmax(logits, axis=-1) == y)
            acc = (total + value * n, seen + n, correct + hits, counted + n, average, jnp.ones_like(started))
            out = (out, average)
        return (optax.apply_updates(params, updates), opt_state, acc), out

    step = jax.jit(step, donate_argnums=0)

    def run() -> float:
        carry = init()
        jax.block_until_ready(carry)
        start = time.perf_counter()
        for x, y in data:
            carry, out = step(carry, x, y)
        jax.block_until_ready((carry, out))
        return time.perf_counter() - start

    return run


def hand_scan(hidden: tuple[int, ...], data: list[Any], k: int) -> Callable[[], float]:
    module, tx = MLP(hidden), optax.adam(1e-3)

    def one(carry: Any, batch: Any) -> Any:
        params, opt_state = carry
        x, y = batch

        def loss(p: Any) -> jax.Array:
            return optax.softmax_cross_entropy_with_integer_labels(module.apply({"params": p}, x), y).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), value

    many = jax.jit(lambda carry, xs: jax.lax.scan(one, carry, xs), donate_argnums=0)

    def run() -> float:
        params = module.init(jax.random.PRNGKey(0), jnp.ones((1, 784)))["params"]
        carry = (params, tx.init(params))
        jax.block_until_ready(carry)
        start = time.perf_counter()
        for i in range(0, len(data), k):  # stack each group from the batch stream, as ember does
            group = data[i : i + k]
            carry, values = many(carry, (np.stack([x for x, _ in group]), np.stack([y for _, y in group])))
        jax.block_until_ready((carry, values))
        return time.perf_counter() - start

    return run


def ember_run(
    hidden: tuple[int, ...], data: list[Any], *, k: int = 1, extra: str = "", aux: bool = False
) -> Callable[[], float]:
    """The ember trainer, built (and compiled) once and restarted for each timed run.

    ``extra``: ``""`` (nothing attached), ``"handlers"`` (the typical set) or ``"metrics"``.
    """
    initial = jax.device_get(fresh_state(hidden))  # host copy: every run starts from the same values
    placement = SingleDevice()
    step_loss = loss_with_outputs if aux or extra else loss_fn
    trainer = create_trainer(initial, step_loss, placement=placement, steps_per_call=k)
    if extra:
        attach_metrics(trainer)
    if extra == "handlers":
        ProgressBar(refresh_every=100, stream=open(os.devnull, "w")).attach(trainer, metric_names=["running_loss"])  # noqa: SIM115

    run = timed_runs(trainer, initial)
    return lambda: run(data)


def keras_fit(hidden: tuple[int, ...], data: list[Any], steps_per_execution: int = 1) -> Callable[[], float] | None:
    keras = keras_or_none()
    if keras is None:
        return None
    x = np.concatenate([b[0] for b in data])
    y = np.concatenate([b[1] for b in data])
    batch = len(data[0][0])

    def run() -> float:
        layers = [keras.layers.Dense(h, activation="relu") for h in hidden] + [keras.layers.Dense(10)]
        model = keras.Sequential([keras.Input((784,)), *layers])
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=steps_per_execution,
            jit_compile=True,
        )
        model.fit(
            x[: batch * steps_per_execution * 2], y[: batch * steps_per_execution * 2], batch_size=batch, verbose=0
        )
        start = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        return time.perf_counter() - start

    return run


Run = Callable[[], float]
ROW_BUILDERS: dict[str, Callable[[tuple[int, ...], list[Any]], Run | None]] = {  # each row's run, made for a model
    "hand loop": lambda hidden, data: hand_loop(hidden, data),
    "ember": lambda hidden, data: ember_run(hidden, data),
    "ember + handlers": lambda hidden, data: ember_run(hidden, data, extra="handlers"),
    "hand loop, aux outputs": lambda hidden, data: hand_loop(hidden, data, aux=True),
    "hand loop + metrics in its step": lambda hidden, data: hand_loop(hidden, data, metrics=True),
    "ember, aux outputs": lambda hidden, data: ember_run(hidden, data, aux=True),
    "ember + metrics": lambda hidden, data: ember_run(hidden, data, extra="metrics"),
    "hand scan x10": lambda hidden, data: hand_scan(hidden, data, 10),
    "ember steps_per_call=10": lambda hidden, data: ember_run(hidden, data, k=10),
    "ember steps_per_call=10 + handlers": lambda hidden, data: ember_run(hidden, data, k=10, extra="handlers"),
    "keras fit": lambda hidden, data: keras_fit(hidden, data),
    "keras fit, steps_per_execution=10": lambda hidden, data: keras_fit(hidden, data, 10),
}
RATIOS = {  # each row's reference: its speed is reported against it
    "ember": "hand loop",
    "ember + handlers": "hand loop",
    "ember + metrics": "ember, aux outputs",
    "hand loop + metrics in its step": "hand loop, aux outputs",
    "ember steps_per_call=10": "hand scan x10",
    "ember steps_per_call=10 + handlers": "hand scan x10",
    "keras fit": "hand loop",
    "keras fit, steps_per_execution=10": "hand scan x10",
}


def rows_to_run(only: list[str] | None) -> set[str]:
    """The rows named in ``only`` and their references (every row without ``only``); an unknown name exits."""
    unknown = sorted(set(only or ()) - set(ROW_BUILDERS))
    if unknown:
        raise SystemExit(f"--rows: no row named {unknown}; the rows are {list(ROW_BUILDERS)}")
    return set(ROW_BUILDERS) if only is None else set(only) | {RATIOS[r] for r in only if r in RATIOS}


def measure(
    name: str, hidden: tuple[int, ...], batch: int, steps: int, repeats: int, only: list[str] | None = None
) -> dict[str, float]:
    """Time the rows (those named in ``only`` and their references, or all) interleaved; print and return rates."""
    data = make_data(steps, batch)
    keep = rows_to_run(only)
    built = {name: build(hidden, data) for name, build in ROW_BUILDERS.items() if name in keep}
    runs = {k: v for k, v in built.items() if v is not None}
    for fn in runs.values():
        fn()  # compile and warm up
    times: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(repeats):
        for label, fn in runs.items():
            times[label].append(fn())
    rate = {label: steps / min(t) for label, t in times.items()}
    print(f"\n{name}: batch {batch}, {steps} steps, {repeats} repeats")
    for label, r in rate.items():
        ref = RATIOS.get(label)
        vs = ""
        if ref:
            per_repeat = sorted(a / b for a, b in zip(times[ref], times[label], strict=True))
            n = len(per_repeat)
            median, low, high = per_repeat[n // 2], per_repeat[0], per_repeat[-1]
            quartiles = f"quartiles {per_repeat[n // 4]:.3f}-{per_repeat[3 * n // 4]:.3f}; " if n >= 8 else ""
            vs = f"  {median:.3f} x {ref} (median; {quartiles}range {low:.3f}-{high:.3f})"
        print(f"  {label:<36} {r:9.0f} steps/s{vs}")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="few steps: a smoke run, not a measurement")
    parser.add_argument("--models", default="tiny,512", help="which models: tiny, 512 or both (default)")
    parser.add_argument("--rows", help='comma-separated rows to run with their references, e.g. "ember + metrics"')
    parser.add_argument("--steps", type=int, help="steps per run (default 3000 on the tiny model, 400 on the other)")
    args = parser.parse_args()
    models = args.models.split(",")
    if not models or set(models) - {"tiny", "512"}:
        raise SystemExit(f"--models: expected tiny, 512 or tiny,512, got {args.models!r}")
    only = [r.strip() for r in args.rows.split(",")] if args.rows else None
    rows_to_run(only)  # an unknown row exits here, before anything is built
    keras = keras_or_none()
    print(
        f"python {platform.python_version()}, jax {jax.__version__} on {jax.devices()[0].platform} ({jax.devices()[0]})"
    )
    if keras is not None:
        print(f"keras {keras.__version__} (backend {keras.backend.backend()})")
    small, big = (40, 20) if args.quick else (args.steps or 3000, args.steps or 400)
    if "tiny" in models:
        measure("tiny MLP 784-32-10", (32,), 32, small, args.repeats, only)
    if "512" in models:
        measure("MLP 784-512-512-10", (512, 512), 128, big, args.repeats, only)


if __name__ == "__main__":
    main()
