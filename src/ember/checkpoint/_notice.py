"""How the processes of a run learn how a save went: process 0 commits, and tells the others, error and all.

Every save of a store is a round of `ember._multiprocess.exchange` named by the store's folder: process 0 publishes
what happened to its commit (nothing, or the error), the others wait for it. So in a run of several processes a save
returns on every process once the checkpoint is on disk, or raises the same error on every process (a full disk on
process 0 stops, or warns, everywhere). In a single process nothing is exchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax

from ember._multiprocess import exchange


def describe(error: BaseException) -> str:
    """An error as JSON text that `rebuilt` turns back into one on another process."""
    errno = error.errno if isinstance(error, OSError) else None
    text = error.strerror if isinstance(error, OSError) and error.strerror else str(error).splitlines()[0]
    return json.dumps({"type": type(error).__name__, "errno": errno, "text": text or type(error).__name__})


def rebuilt(process: int, described: str) -> BaseException:
    """The error `describe` described, as this process raises it; another process's says which it was."""
    d = json.loads(described)
    elsewhere = "" if process == jax.process_index() else f" (on process {process})"
    if d["errno"] is not None:
        return OSError(d["errno"], d["text"] + elsewhere)
    return RuntimeError(f"{d['type']}: {d['text']}{elsewhere}")


def committed(root: Path, problem: BaseException | None) -> BaseException | None:
    """One save's notice: process 0 tells its ``problem``; every process returns process 0's (``None``: on disk).

    Call it once per save on every process, in the same order (as every process saves the same checkpoints).
    """
    told = describe(problem) if problem is not None and jax.process_index() == 0 else ""
    answer = exchange(f"commit:{root}", told)[0]
    if problem is not None:
        return problem
    return rebuilt(0, answer) if answer else None


def gathered(
    root: Path, files: dict[str, Any], problem: BaseException | None
) -> tuple[dict[str, Any], BaseException | None]:
    """A save that every process wrote its share of: every process's file records, merged, and the first error.

    Each process hands the others its records (or its error); with an error anywhere, every process has one, so
    none commits and all raise. Call it once per such save on every process, in the same order.
    """
    mine = json.dumps([describe(problem) if problem is not None else "", files])
    everyone = [json.loads(v) for v in exchange(f"save:{root}", mine)]
    failed = [(p, why) for p, (why, _) in enumerate(everyone) if why]
    if problem is None and failed:
        problem = rebuilt(*failed[0])
    merged: dict[str, Any] = {}
    for _, part in everyone:
        merged.update(part)
    return merged, problem
