"""Engine overhead: microseconds per iteration of a no-op process function, beside a bare ``for`` loop.

Each case runs ``--iters`` iterations (default 200,000) in this one process, alternating with the
bare-loop reference, and reports the best of ``--repeats`` runs:

- ``bare loop``: ``for batch in data: process(None, batch)``, the floor any engine pays;
- ``no handlers``: ``Engine.run`` with nothing attached;
- ``5 handlers``: five plain ITERATION_COMPLETED handlers, each called every iteration;
- ``5 x every=100`` and ``20 x every=100``: filtered handlers that fire once per 100 iterations.

Derived numbers: the engine's own overhead (``no handlers`` minus ``bare loop``), the cost per handler
call, and the cost per filtered handler per iteration (including the 1 in 100 that fire).

Run: ``python benchmarks/engine_overhead.py [--iters N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable

from ember import Engine, Events


def noop_process(engine: object, batch: object) -> None:
    return None


def noop_handler(engine: Engine) -> None:
    return None


def time_bare(data: list[int]) -> float:
    start = time.perf_counter()
    for batch in data:
        noop_process(None, batch)
    return time.perf_counter() - start


def time_engine(data: list[int], attach: Callable[[Engine], None]) -> float:
    engine = Engine(noop_process)
    attach(engine)
    start = time.perf_counter()
    engine.run(data, max_epochs=1)
    return time.perf_counter() - start


def attach_plain(n: int) -> Callable[[Engine], None]:
    def attach(engine: Engine) -> None:
        for _ in range(n):
            engine.add_event_handler(Events.ITERATION_COMPLETED, noop_handler)

    return attach


def attach_every(n: int, every: int) -> Callable[[Engine], None]:
    def attach(engine: Engine) -> None:
        for _ in range(n):
            engine.add_event_handler(Events.ITERATION_COMPLETED(every=every), noop_handler)

    return attach


CASES: dict[str, Callable[[Engine], None]] = {
    "no handlers": lambda engine: None,
    "5 handlers": attach_plain(5),
    "5 x every=100": attach_every(5, 100),
    "20 x every=100": attach_every(20, 100),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    data = list(range(args.iters))
    best = {name: float("inf") for name in ["bare loop", *CASES]}
    for _ in range(args.repeats):
        best["bare loop"] = min(best["bare loop"], time_bare(data))
        for name, attach in CASES.items():
            best[name] = min(best[name], time_engine(data, attach))
    us = {name: 1e6 * t / args.iters for name, t in best.items()}
    print(f"python {platform.python_version()} on {platform.machine()}, {args.iters} iterations, best of {args.repeats}")
    for name, v in us.items():
        print(f"  {name:<16} {v:7.3f} us/iter   ({v / us['bare loop']:5.1f}x bare loop)")
    overhead = us["no handlers"] - us["bare loop"]
    print(f"engine overhead, no handlers:              {overhead:6.3f} us/iter (target <= 1.0)")
    print(f"per handler call:                          {(us['5 handlers'] - us['no handlers']) / 5:6.3f} us (target <= 0.3)")
    for n in (5, 20):
        per = (us[f"{n} x every=100"] - us["no handlers"]) / n
        print(f"per every=100 handler per iteration, {n:>2}x: {per:6.3f} us (target <= 0.1)")


if __name__ == "__main__":
    main()
