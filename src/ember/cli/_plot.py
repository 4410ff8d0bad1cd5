"""`ember plot`: a PNG of a run's loss and metric curves, from its ``metrics.jsonl``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from ember._extras import missing
from ember._ledger_file import CATEGORIES, read_records, totals


def plot_run(run_dir: str | os.PathLike[str], output: str | os.PathLike[str] | None = None) -> Path:
    """Draw a run's scalars against the step into a PNG; return its path.

    Every scalar in ``run_dir/metrics.jsonl`` gets a line, one panel per unit: the losses of training and validation
    on one axis, the accuracy on its own, the learning rates on theirs (`panels`); a run with a goodput ledger
    (``goodput.jsonl``) gets a last panel of where its wall time went. The PNG is ``run_dir/curves.png`` unless
    ``output`` says otherwise.

    Examples:
        >>> import json, tempfile, pathlib
        >>> from ember.cli import plot_run
        >>> run = pathlib.Path(tempfile.mkdtemp())
        >>> rows = [{"step": s, "train/loss": 1 / s} for s in (1, 2, 3)] + [{"step": 3, "val/accuracy": 0.9}]
        >>> _ = (run / "metrics.jsonl").write_text("".join(json.dumps(r) + chr(10) for r in rows))
        >>> plot_run(run).name
        'curves.png'
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(missing("ember plot", "matplotlib", "cli")) from e
    log = Path(run_dir) / "metrics.jsonl"
    if not log.exists():
        raise FileNotFoundError(f"No metrics.jsonl in {run_dir}; was it written by ember train?")
    series = curves(log.read_text().splitlines())
    if not series:
        raise ValueError(f"{log} holds no scalars to plot.")
    groups = panels(series)
    ledger = read_records(run_dir)
    count = len(groups) + bool(ledger)
    fig = Figure(figsize=(5 * count, 3.5), dpi=100)
    canvas = FigureCanvasAgg(fig)
    if ledger:  # where the wall time went, over every relaunch (goodput.jsonl)
        t = totals(ledger)
        ax = fig.add_subplot(1, count, count)
        ax.barh(list(CATEGORIES)[::-1], [t[name] for name in CATEGORIES][::-1])
        ax.set_xlabel("seconds")
        ax.set_title(f"goodput {t['productive'] / (t['wall'] or 1.0):.1%} of {t['wall']:.0f} s, {len(ledger)} run(s)")
    for i, (group, names) in enumerate(groups.items(), 1):
        ax = fig.add_subplot(1, count, i)
        for name in names:
            steps, values = zip(*series[name], strict=True)
            ax.plot(steps, values, label=name, marker="o" if len(steps) < 30 else None)
        ax.set_xlabel("step")
        ax.set_title(group)
        ax.legend()
    fig.tight_layout()
    path = Path(output) if output is not None else Path(run_dir) / "curves.png"
    canvas.print_png(str(path))
    return path


def curves(lines: Iterable[str]) -> dict[str, list[tuple[int, float]]]:
    """Each scalar's ``(step, value)`` points from ``metrics.jsonl`` lines, by step; the last one of a step wins.

    A run stopped and resumed logs the steps after its checkpoint twice (the stopped run's, then the resumed run's):
    the resumed run's values are the ones its state went on from, so they replace the others.

    Examples:
        >>> from ember.cli._plot import curves
        >>> lines = ['{"step": 1, "loss": 0.9}', '{"step": 2, "loss": 0.7}', '{"step": 2, "loss": 0.6}']
        >>> curves(lines)
        {'loss': [(1, 0.9), (2, 0.6)]}
    """
    points: dict[str, dict[int, float]] = {}
    for line in lines:
        row = json.loads(line)
        if "step" not in row:
            continue
        for name, value in row.items():
            if name not in ("step", "time") and isinstance(value, int | float):
                points.setdefault(name, {})[int(row["step"])] = float(value)
    return {name: sorted(values.items()) for name, values in points.items()}


def panels(names: Iterable[str]) -> dict[str, list[str]]:
    """Which scalars share a panel, and so an axis: those of one unit, named by the last part of their names.

    ``train/loss`` and ``val/loss`` go together, ``val/accuracy`` apart, the learning rates together.

    Examples:
        >>> from ember.cli._plot import panels
        >>> for title, names in panels(["train/loss", "train/lr", "val/accuracy", "val/loss", "time"]).items():
        ...     print(title, names)
        time ['time']
        loss ['train/loss', 'val/loss']
        learning rate ['train/lr']
        accuracy ['val/accuracy']
    """
    groups: dict[str, list[str]] = {}
    for name in sorted(names):
        last = name.rsplit("/", 1)[-1]
        groups.setdefault("learning rate" if last in ("lr", "learning_rate") else last, []).append(name)
    return groups
