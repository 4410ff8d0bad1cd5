"""The goodput ledger's file: its categories and how its records are read (no JAX: ``ember goodput`` reads it)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

#: The categories a run's wall time is split into, in the order the table shows them.
CATEGORIES = ("startup", "compilation", "productive", "data", "checkpoint", "evaluation", "lost", "other")

#: The ledger's file in a run folder.
FILENAME = "goodput.jsonl"

#: The environment variable a process ``ember launch --max-restarts`` restarted finds its restart in, as JSON; the
#: ledger records it (``restart``).
RESTART_VARIABLE = "EMBER_RESTART"


def read_records(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Each run's last record in ``run_dir/goodput.jsonl``, oldest run first (``[]`` without the file).

    A line cut short (a process killed while writing it) is skipped: that run's earlier line stands. A line that is
    JSON but not a ledger record (``42``, ``{}``, a record without its run, times or numbers) is skipped with a
    ``RuntimeWarning`` naming its line number. A run whose last record says ``"running"`` but is followed by
    another run ended without a word (a SIGKILL, a lost machine): it reads as ``"killed"``.

    Examples:
        >>> import tempfile
        >>> from ember._ledger_file import read_records
        >>> read_records(tempfile.mkdtemp())
        []
    """
    path = Path(run_dir) / FILENAME
    if not path.exists():
        return []
    last: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not _is_record(record):
            shown = line if len(line) <= 80 else line[:77] + "..."
            message = f"{path}, line {number}: not a goodput record, skipped: {shown}"
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            continue
        last[record["run"]] = record
    runs = sorted(last.values(), key=lambda r: r["time"] - r["wall"])
    for record in runs[:-1]:  # a launch still "running" when a later one started was killed without a word
        if record.get("ended", "running") == "running":
            record["ended"] = "killed"
    return runs


def _is_record(record: Any) -> bool:
    """Whether ``record`` has what the readers use: its run's id, its time and wall time, numbers per category."""
    if not isinstance(record, dict) or not isinstance(record.get("run"), str):
        return False
    numbers = [record.get("time"), record.get("wall"), *(record.get(c, 0.0) for c in CATEGORIES)]
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in numbers)


def totals(records: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds per category over every run: the steps trained again move from productive time to ``lost``.

    Examples:
        >>> from ember._ledger_file import totals
        >>> runs = [{"wall": 10.0, "productive": 8.0, "lost": 0.0, "other": 2.0},
        ...         {"wall": 5.0, "productive": 4.0, "lost": 2.0, "other": 1.0}]
        >>> t = totals(runs)
        >>> t["productive"], t["lost"], t["wall"]
        (10.0, 2.0, 15.0)
    """
    out = {name: float(sum(r.get(name, 0.0) for r in records)) for name in CATEGORIES}
    out["productive"] -= out["lost"]
    out["wall"] = float(sum(r["wall"] for r in records))
    return out
