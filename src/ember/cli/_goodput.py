"""`ember goodput`: where a run's wall time went over its whole life, from its ``goodput.jsonl``."""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from ember._ledger_file import CATEGORIES, FILENAME, read_records, totals


def goodput_records(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Each run's last record in ``run_dir/goodput.jsonl``, oldest first; a ``FileNotFoundError`` without one."""
    if not (Path(run_dir) / FILENAME).exists():
        raise FileNotFoundError(f"No goodput.jsonl in {run_dir}; ember train writes one (GoodputLedger in a script).")
    return read_records(run_dir)


def _restarted(record: dict[str, Any]) -> str:
    """What a run's line adds when ``ember launch`` restarted it: which restart, after what, how long after."""
    restart = record.get("restart")
    if not isinstance(restart, dict):
        return ""
    number, of, cause = restart.get("number"), restart.get("of"), restart.get("cause")
    return f"; restart {number} of {of} after {cause}, {float(restart.get('waited', 0.0)):.1f} s later"


def _spread(records: list[dict[str, Any]]) -> list[str]:
    """Per step, the processes' step times and times outside it, over the runs that compared them (StragglerReport)."""
    seen = [r["stragglers"] for r in records if isinstance(r.get("stragglers"), dict)]
    if not seen:
        return []
    lines = ["processes (ms per step, every run that compared them):"]
    for what, key in (("step", "step_time"), ("outside it", "outside_step")):
        each = [(float(t), p) for s in seen for p, t in s.get(key, {}).items()]
        if each:
            slowest, who = max(each)
            median = statistics.median(t for t, _ in each)
            lines.append(f"  {what:<10} median {median * 1e3:.2f}, slowest {slowest * 1e3:.2f} (process {who})")
    named = sorted({int(p) for s in seen for p in s.get("named", [])})
    if named:
        lines.append(f"  lagging: process {', '.join(map(str, named))}")
    return lines


def goodput_table(run_dir: str | os.PathLike[str]) -> str:
    """The table ``ember goodput RUN_DIR`` prints: seconds and shares per category, the goodput, each run.

    Examples:
        >>> import json, tempfile, pathlib
        >>> from ember.cli import goodput_table
        >>> run = pathlib.Path(tempfile.mkdtemp())
        >>> record = {"run": "a", "time": 100.0, "wall": 10.0, "startup": 1.0, "compilation": 1.0, "productive": 7.0,
        ...           "data": 0.5, "checkpoint": 0.2, "evaluation": 0.2, "lost": 0.0, "other": 0.1, "cache_hits": 0,
        ...           "cache_saved": 0.0, "first_iteration": 0, "last_iteration": 50, "steps": 50, "lost_steps": 0,
        ...           "ended": "completed"}
        >>> _ = (run / "goodput.jsonl").write_text(json.dumps(record) + chr(10))
        >>> print(goodput_table(run).splitlines()[-2])
        goodput: 70.0% of 10.0 s (productive training steps over the wall time of every run)
    """
    records = goodput_records(run_dir)
    t = totals(records)
    wall = t["wall"] or 1.0
    lines = [f"{'category':<12}{'seconds':>10}{'share':>9}"]
    lines += [f"{name:<12}{t[name]:>10.2f}{t[name] / wall:>9.1%}" for name in CATEGORIES]
    lines.append(f"{'wall':<12}{t['wall']:>10.2f}{1:>9.1%}")
    lines.append("runs:")
    for i, r in enumerate(records, 1):
        lost = f", {r['lost_steps']} steps trained again" if r.get("lost_steps") else ""
        lines.append(
            f"  {i}. iterations {r['first_iteration']}-{r['last_iteration']}, {r['wall']:.1f} s, {r['ended']}{lost}"
            f"{_restarted(r)}"
        )
    hits, saved = sum(r.get("cache_hits", 0) for r in records), sum(r.get("cache_saved", 0.0) for r in records)
    lines.append(
        f"goodput: {t['productive'] / wall:.1%} of {t['wall']:.1f} s (productive training steps over the wall time "
        "of every run)"
    )
    lines.append(f"persistent compilation cache: {hits} hits, {saved:.1f} s of compilation saved")
    lines += _spread(records)
    restarts = [r["restart"] for r in records if isinstance(r.get("restart"), dict)]
    if restarts:
        waited = sum(max(0.0, float(r.get("waited", 0.0))) for r in restarts)
        lines.append(
            f"restarts: {len(restarts)} by ember launch, {waited:.1f} s from the failures to the relaunched processes' "
            "start (not in the wall time above)"
        )
    return "\n".join([f"{run_dir}: {len(records)} run{'s' if len(records) != 1 else ''}", *lines])
