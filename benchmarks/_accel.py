"""What the accelerator workloads share: sizes, a timed window of steps, MFU and memory, and the report.

Each workload (``_lm.py``, ``_resnet.py``) gives two sides, ember's and a hand-written JAX loop doing the same
work. A side is ``warm()`` (compiles everything: the step, the evaluation, a checkpoint) and then ``window()``:
``steps`` training steps with an evaluation and a checkpoint every ``every`` steps, timed from the first step to
the last state and the last checkpoint on disk. The sides alternate window by window, so drift hits both alike.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
from _runs import interleaved

from ember.handlers._reporting.throughput import PEAK_FLOPS


@dataclass
class Side:
    """One side of a workload: how to warm it up, how to run one timed window, and what one step costs.

    ``window()`` returns the seconds the window took; ``flops`` is the compiled train step's FLOPs per device
    (XLA's ``cost_analysis``), ``items`` the tokens or images one step trains on.
    """

    name: str
    warm: Callable[[], None]
    window: Callable[[], float]
    flops: float
    items: int
    notes: list[str] = field(default_factory=list)


def device_peak() -> float | None:
    """The first device's peak dense bfloat16 FLOP/s, where ember's table knows the device (never a CPU)."""
    return PEAK_FLOPS.get(jax.devices()[0].device_kind)


def memory_peak() -> int | None:
    """The most bytes the first device has held so far in this process (``None`` where the backend does not say)."""
    stats = jax.local_devices()[0].memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


def measure(
    sides: list[Side], steps: int, repeats: int, unit: str, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Warm each side up (recording the device's memory peak after each), then time ``repeats`` windows each."""
    peaks = {}
    for side in sides:
        start = time.perf_counter()
        side.warm()
        say(f"  {side.name}: warmed up in {time.perf_counter() - start:.1f} s (compilation included)")
        peaks[side.name] = memory_peak()
    times = interleaved({side.name: side.window for side in sides}, repeats)
    peak = device_peak()
    rows = {}
    for side in sides:
        median = statistics.median(times[side.name])
        rate = steps / median
        rows[side.name] = {
            "steps_per_s": rate,
            f"{unit}_per_s": rate * side.items,
            "mfu": None if peak is None else side.flops * rate / peak,
            "memory_peak_gib": None if peaks[side.name] is None else peaks[side.name] / 2**30,
            "seconds": times[side.name],
        }
    reference = rows[sides[-1].name]["steps_per_s"]
    for side in sides:
        rows[side.name]["ratio_to_hand"] = rows[side.name]["steps_per_s"] / reference
    return rows


def table(workload: str, rows: dict[str, Any], unit: str, steps: int) -> str:
    """The results as a Markdown table, the hand loop last."""
    lines = [
        f"{workload}: {steps} steps per window, median of the windows; {jax.devices()[0].device_kind} "
        f"x{len(jax.devices())}, jax {jax.__version__}",
        f"| side | steps/s | {unit}/s | MFU | device memory peak | vs hand loop |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        mfu = "n/a" if row["mfu"] is None else f"{row['mfu']:.1%}"
        mem = "n/a" if row["memory_peak_gib"] is None else f"{row['memory_peak_gib']:.2f} GiB"
        lines.append(
            f"| {name} | {row['steps_per_s']:.2f} | {row[f'{unit}_per_s']:,.0f} | {mfu} | {mem} | "
            f"{row['ratio_to_hand']:.3f}x |"
        )
    return "\n".join(lines)


def timed(run: Callable[[], object]) -> float:
    """Seconds ``run()`` takes; it must block until its work is done (states ready, checkpoints on disk)."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def ember_side(trainer: Any, host_state: Any, saver: Any, train: list[Any], items: int, notes: list[str]) -> Side:
    """Ember's side: each window a fresh run of ``trainer`` over ``train`` from ``host_state``, to the last save."""
    flops = trainer.step_cost(train[0])["flops"] if device_peak() else 0.0  # an MFU needs the device's peak

    def window() -> float:
        trainer.state.train_state = trainer.placement.put_state(host_state)
        trainer.state.max_epochs = None  # a fresh run each window, its checkpoints replacing the last window's
        jax.block_until_ready(trainer.state.train_state)

        def run() -> None:
            trainer.run(train)
            saver.wait()
            jax.block_until_ready(trainer.state.train_state)

        return timed(run)

    return Side("ember", window, window, flops, items, notes)


def hand_side(
    step: Callable[..., Any],
    initial: Any,
    shardings: Any,
    batch_sharding: Any,
    train: list[Any],
    every: int,
    evaluate: Callable[[Any], object],
    saved: Callable[[Any], Any],
    folder: Any,
    items: int,
) -> Side:
    """A hand-written loop: ``step`` jitted with the state donated, evaluations and Orbax saves every ``every`` steps.

    ``evaluate(state)`` runs the evaluation; ``saved(state)`` is what is checkpointed (one save in flight at a
    time, as ember's store); a window ends when the last save is on disk.
    """
    import orbax.checkpoint as ocp

    compiled = jax.jit(step, donate_argnums=0, out_shardings=(shardings, None))
    flops = 0.0
    if device_peak():  # an MFU needs the device's peak: compile once more to read the step's FLOPs
        lowered = compiled.lower(jax.device_put(initial, shardings), jax.device_put(train[0], batch_sharding))
        flops = (lowered.compile().cost_analysis() or {}).get("flops", 0.0)
    checkpointer = ocp.StandardCheckpointer()
    windows = [0]

    def run() -> None:
        windows[0] += 1
        state = jax.device_put(initial, shardings)
        for i, batch in enumerate(train, 1):
            state, _ = compiled(state, jax.device_put(batch, batch_sharding))
            if i % every == 0:
                evaluate(state)
                checkpointer.wait_until_finished()  # one save in flight at a time, as ember's store
                target = folder / f"{windows[0] % 2}_{i}"
                shutil.rmtree(target, ignore_errors=True)
                checkpointer.save(target, saved(state))
        checkpointer.wait_until_finished()
        jax.block_until_ready(state)

    return Side("hand loop", run, lambda: timed(run), flops, items)
