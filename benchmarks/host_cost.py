"""ember's own host cost per step: a near-free jitted step, driven by ember's trainer and by a hand loop.

The step trains 3 parameters on a 4 x 3 batch, so what is left is host work: the hand loop calls the
trainer's own compiled step (the same function, the same ``TrainState`` pytree, the same dict output) in a
bare ``for`` loop; ember's trainer runs it with its engine and its process function, with no handlers, and
with a typical set (a running average of the loss, an epoch-wise ``Average``, both updated inside the step,
and a progress bar that refreshes every 100 steps), and with two named evaluations (``Evaluations``) that are not
due in the run, and with the typical set plus a ``StragglerReport`` as each process of a multi-process run has it.
The handler row is measured against a hand loop calling its own compiled step, which carries the two
metrics' states, so both sides do the same device work. The difference
is ember's added microseconds per step. When PyTorch Ignite is importable (not a dependency: ``pip install torch
pytorch-ignite``), its ``Engine`` drives the same compiled step and state with no handlers, a row of its own against
the first hand loop. Rows alternate; the best and the median of the repeats are shown.

Run: ``python benchmarks/host_cost.py [--steps N] [--repeats R]``; results in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _runs import attach_metrics, interleaved

from ember import Engine, Events
from ember.handlers import Evaluations, ProgressBar, StragglerReport
from ember.training import TrainState, create_trainer


def loss_fn(model: Any, batch: Any) -> Any:
    return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)


def with_straggler_report(trainer: Any) -> None:
    """A `StragglerReport` attached as on each process of a multi-process run, windows of 100 (one process: none).

    Its timing handlers on every step and its comparison every window, the exchange answered here (the coordination
    service's round trip, once a window, is left out).
    """
    from unittest import mock

    from ember.handlers._reporting import stragglers

    stragglers.exchange = lambda name, value: [value, value]  # type: ignore[assignment]
    with mock.patch.object(jax, "process_count", return_value=2):
        StragglerReport(every=100).attach(trainer)


def make_trainer(handlers: bool, evaluations: bool = False, stragglers: bool = False) -> Any:
    state = TrainState.create(lambda p, x: x @ p, jnp.zeros(3), optax.sgd(1e-3))
    trainer = create_trainer(state, loss_fn)
    if stragglers:
        with_straggler_report(trainer)
    if evaluations:  # two evaluations that are never due in the run: what they cost until they are
        named = Evaluations(trainer)
        named.add("val", Engine(lambda e, b: b), [0], Events.ITERATION_COMPLETED(every=10**9))
        named.add("val_noisy", Engine(lambda e, b: b), [0], Events.ITERATION_COMPLETED(every=10**9))
    if handlers:
        attach_metrics(trainer, "LR")
        ProgressBar(refresh_every=100, stream=io.StringIO()).attach(trainer, metric_names=["running_loss"])
    return trainer


def ember_side(
    data: list[Any], handlers: bool, evaluations: bool = False, stragglers: bool = False
) -> Callable[[], float]:
    trainer = make_trainer(handlers, evaluations, stragglers)
    trainer.run(data[:2], max_epochs=1)  # compile

    def run() -> float:
        start = time.perf_counter()
        trainer.run(data, max_epochs=1)
        jax.block_until_ready(trainer.state.train_state)
        return (time.perf_counter() - start) / len(data)

    return run


def compiled_step(handlers: bool, data: list[Any]) -> tuple[Any, list[Any]]:
    """The trainer's own compiled step, and a holder of what it carries (with the metrics' states, for ``handlers``)."""
    trainer = make_trainer(handlers)
    trainer.run(data[:2], max_epochs=1)  # compile, and leave the compiled step in the trainer's cache
    step = next(iter(trainer.process_function.compiled.values()))
    metrics = trainer.fused_metrics  # with handlers: the step carries (train state, metric states)
    state = trainer.state.train_state
    return step, [(state, tuple(m.state for m in metrics)) if metrics else state]


def ignite_side(data: list[Any]) -> Callable[[], float] | None:
    """Ignite's ``Engine`` calling the trainer's own compiled step on its state, no handlers (``None``: no Ignite)."""
    try:
        from ignite.engine import Engine as IgniteEngine
    except ImportError:
        return None
    step, holder = compiled_step(False, data)

    def process(engine: Any, batch: Any) -> Any:
        holder[0], out = step(holder[0], batch)
        return out

    engine = IgniteEngine(process)

    def run() -> float:
        start = time.perf_counter()
        engine.run(data, max_epochs=1)
        jax.block_until_ready(holder[0])
        return (time.perf_counter() - start) / len(data)

    return run


def hand_side(data: list[Any], handlers: bool) -> Callable[[], float]:
    """The trainer's own compiled step and state (with the metrics' states, for ``handlers``) called in a bare loop."""
    step, holder = compiled_step(handlers, data)

    def run() -> float:
        start = time.perf_counter()
        state = holder[0]
        for batch in data:
            state, _ = step(state, batch)
        jax.block_until_ready(state)
        holder[0] = state
        return (time.perf_counter() - start) / len(data)

    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    data = [
        {"x": rng.normal(size=(4, 3)).astype(np.float32), "y": rng.normal(size=4).astype(np.float32)}
        for _ in range(args.steps)
    ]
    sides = {
        "hand loop": hand_side(data, False),
        "ember": ember_side(data, False),
        "ember, 2 evals not due": ember_side(data, False, evaluations=True),
    }
    ignite = ignite_side(data)
    if ignite is not None:
        sides[f"Ignite {__import__('ignite').__version__}"] = ignite
    sides |= {
        "hand loop, metrics": hand_side(data, True),
        "ember + handlers": ember_side(data, True),
        "ember + handlers + stragglers": ember_side(data, True, stragglers=True),
    }
    times = interleaved(sides, args.repeats)
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {args.steps} steps, {args.repeats} repeats")
    reference = None
    for name, values in times.items():
        best, median = 1e6 * min(values), 1e6 * statistics.median(values)
        line = f"{name:30s} {best:7.1f} us/step (best)  {median:7.1f} (median)"
        if name.startswith("hand"):
            reference = (best, median)
        else:
            assert reference is not None
            line += f"  added: {best - reference[0]:+.1f} (best) / {median - reference[1]:+.1f} (median) us"
        print(line)


if __name__ == "__main__":
    main()
