"""What each default handler of ``ember train`` costs the digits run: the whole run with that one handler left out.

``ember train`` on the default digits config (early stopping off, so every run trains the same epochs) is run
whole, and again with one of its default parts left out, the variants alternating round by round in one process.
A part is left out by replacing its ``attach`` with one that attaches nothing (or by the config switch that turns
it off), so everything else is exactly what ``ember train`` does. Reported per part: the later epochs' time with
and without it, and its cost as a share of a later epoch and in microseconds per step (22 steps an epoch); the sum
of the parts' shares is the handlers' cost together, against the 2% target of ``docs/benchmarks.md``. JAX's
persistent compilation cache is off in every variant: its folder is the process's, fixed by the first run, so it
cannot be left out of one run in a process; ``first_step.py --cache`` measures it in processes of their own.

On this 2-core machine a run's wall time moves by a few percent from run to run, more than most parts cost, so
``--cpu`` measures what does not move: the CPU time each handler takes on the training thread (``time.thread_time``
around every handler call, which leaves out its waits for the device) and each background thread's CPU time, over
the later epochs of one run, in microseconds per step. On a CPU backend the steps run on the same two cores, so a
handler's CPU time is the time it takes from the steps.

Run: ``python benchmarks/handler_costs.py [--repeats N] [--epochs E] [--parts a,b] [--cpu]``; results in
``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from _runs import interleaved
from workloads import EpochClock, EpochLines, Timing, timed_in_folder

from ember.cli import train
from ember.handlers import (
    Checkpoint,
    GoodputLedger,
    LRMonitor,
    Preemption,
    ScalarLogger,
    StallWatchdog,
    TerminateOnNan,
)
from ember.training._batch_spec import BatchSpec

STEPS_PER_EPOCH = 22  # the digits training split in batches of 64


def _attach_nothing(self: Any, *args: Any, **kwargs: Any) -> None:
    return None


@contextlib.contextmanager
def _without(*classes: type) -> Iterator[None]:
    """Every class in ``classes`` attaches nothing while the block runs."""
    with contextlib.ExitStack() as stack:
        for cls in classes:
            stack.enter_context(mock.patch.object(cls, "attach", _attach_nothing))
        yield


@contextlib.contextmanager
def _no_dtype_check() -> Iterator[None]:
    with mock.patch.object(BatchSpec, "check_dtypes", return_value=None):
        yield


#: part -> (what it is, config overrides that leave it out, a context manager that leaves it out)
PARTS: dict[str, tuple[str, dict[str, Any], Callable[[], contextlib.AbstractContextManager[None]]]] = {
    "progress": ("the progress bar, every 10 steps", {"handlers": {"progress": False}}, contextlib.nullcontext),
    "logging": ("ScalarLogger and LRMonitor every 50 steps", {}, lambda: _without(ScalarLogger, LRMonitor)),
    "writers": ("the TensorBoard and JSONL writers", {"handlers": {"writers": []}}, contextlib.nullcontext),
    "checkpoints": ("the latest and best checkpoints", {}, lambda: _without(Checkpoint)),
    "preemption": ("Preemption (SIGTERM, Ctrl-C)", {}, lambda: _without(Preemption)),
    "nan_guard": ("TerminateOnNan on the loss", {}, lambda: _without(TerminateOnNan)),
    "goodput": ("the goodput ledger", {}, lambda: _without(GoodputLedger)),
    "stall": ("a StallWatchdog (off by default; its cost when on)", {}, lambda: _without(StallWatchdog)),
    "dtype_check": ("the per-step check of each batch's dtypes", {}, _no_dtype_check),
}


def _config(epochs: int, folder: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "trainer": {"max_epochs": epochs, "compilation_cache": None},
        "handlers": {"early_stopping": None},
    }
    for section, values in overrides.items():
        config.setdefault(section, {}).update(values)
    return {**config, "output": str(folder / "run")}


def run(epochs: int, part: str | None) -> Callable[[], Timing]:
    """One ``ember train`` run, whole (``part=None``) or without ``part``; returns how long it took."""
    overrides, leave_out = ({}, contextlib.nullcontext) if part is None else PARTS[part][1:]
    if part == "stall":  # off by default: measured as the cost of turning it on
        overrides = {"handlers": {"stall": {}}}
        leave_out = contextlib.nullcontext

    def work(folder: Path, clock: EpochClock) -> None:
        with leave_out():
            train(_config(epochs, folder, overrides), stream=EpochLines(clock), progress_stream=io.StringIO())

    return lambda: timed_in_folder(work)


def cpu_per_handler(epochs: int) -> None:
    """One run's CPU microseconds per step: each handler on the training thread, each other thread, in later epochs."""
    import collections
    import os
    import threading
    import time

    import ember.engine._dispatch as dispatch

    spent: collections.Counter[str] = collections.Counter()
    counting = [False]
    make_call = dispatch._make_call

    def timed_call(handler: Any, *args: Any) -> Any:
        call = make_call(handler, *args)
        name = getattr(handler, "__qualname__", None) or type(handler).__name__

        def timed(*given: Any) -> Any:
            start = time.thread_time()
            try:
                return call(*given)
            finally:
                if counting[0] and threading.current_thread() is threading.main_thread():
                    spent[name] += time.thread_time() - start

        return timed

    def threads() -> collections.Counter[str]:
        names = {t.native_id: t.name.split("_")[0] for t in threading.enumerate()}
        cpu: collections.Counter[str] = collections.Counter()
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(FileNotFoundError), open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2 :].split()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            cpu[names.get(int(tid), f"native {comm}")] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return cpu

    class FromTheSecondEpoch(EpochLines):
        """Counts handler time, and takes the threads' CPU times, once the first epoch's line is printed."""

        def write(self, s: str) -> int:
            written = super().write(s)
            if len(self.clock.ends) == 1 and not counting[0]:
                counting[0], before[0] = True, threads()
            return written

    def work(folder: Path, clock: EpochClock) -> None:
        train(_config(epochs, folder, {}), stream=FromTheSecondEpoch(clock), progress_stream=io.StringIO())

    before: list[collections.Counter[str]] = [collections.Counter()]
    with mock.patch.object(dispatch, "_make_call", timed_call):
        run(1, None)()  # warm-up: imports, library compilations
        timed_in_folder(work)
        counting[0] = False
    after = threads()
    steps = (epochs - 1) * STEPS_PER_EPOCH
    print(f"ember train, digits, {epochs} epochs; CPU time in epochs 2-{epochs}, µs per step")
    print("on the training thread, by handler | µs per step")
    for name, seconds in spent.most_common():
        if seconds * 1e6 / steps >= 0.5:
            print(f"{name} | {seconds * 1e6 / steps:.1f}")
    print(f"every handler together | {sum(spent.values()) * 1e6 / steps:.1f}")
    print("by thread | µs per step")
    for name in sorted(after, key=lambda n: before[0][n] - after[n]):
        used = after[name] - before[0][name]
        if used * 1e6 / steps >= 0.5:
            print(f"{name} | {used * 1e6 / steps:.1f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="runs per variant (default 7)")
    parser.add_argument("--epochs", type=int, default=15, help="epochs per run (default 15)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {','.join(PARTS)}")
    parser.add_argument("--cpu", action="store_true", help="CPU time per handler and per thread, in one run")
    args = parser.parse_args(argv)
    if args.cpu:
        cpu_per_handler(args.epochs)
        return
    parts = args.parts.split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part {unknown[0]!r}; the parts are {','.join(PARTS)}")
    sides = {"all": run(args.epochs, None)} | {p: run(args.epochs, p) for p in parts}
    times = interleaved(sides, args.repeats, warm_up=True)
    whole = [t.steady for t in times["all"]]
    base = statistics.median(t for t in whole if t is not None)
    print(f"ember train, digits, {args.epochs} epochs, {args.repeats} repeats; later epochs, median ms")
    print("part | what | ms per later epoch, without it | its cost, % of a later epoch | µs per step")
    print(f"all | every default handler | {base * 1e3:.2f} | |")
    total = 0.0
    for part in parts:
        steady = [t.steady for t in times[part] if t.steady is not None]
        # the run with the part on, less the run without it, round by round (stall: the part is on in times[part])
        pairs = [(a, b) for a, b in zip(whole, steady, strict=True) if a is not None]
        cost = statistics.median((b - a) if part == "stall" else (a - b) for a, b in pairs)
        total += cost if part != "stall" else 0.0
        print(
            f"{part} | {PARTS[part][0]} | {statistics.median(steady) * 1e3:.2f} | {100 * cost / base:+.2f} | "
            f"{cost / STEPS_PER_EPOCH * 1e6:+.1f}"
        )
    print(f"together (every default part, the stall watchdog aside) | {100 * total / base:+.2f}% of a later epoch")


if __name__ == "__main__":
    main()
