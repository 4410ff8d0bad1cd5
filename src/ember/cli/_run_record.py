"""What a run folder of `ember train` records (its config, its summary), read without importing JAX."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ember.cli._config import Config, ConfigError, load_config

#: Config fields a relaunch may change: they do not change what the run computes. ``output`` names the folder
#: itself (``ember resume ../runs/digits`` from another folder gives it as seen from there).
COSMETIC = frozenset({"handlers.progress", "output"})

#: Where the run's arrays live, which a relaunch may change too: the checkpoint restores onto the new layout.
LAYOUT = frozenset({"trainer.placement", "trainer.mesh", "trainer.rules"})

#: What ``summary["stopped"]`` holds for a run a signal stopped (it can be resumed), and its exit status: 128 + the
#: signal's number, as a shell reports a command a signal ended.
SIGNAL_STATUS = {"SIGINT": 130, "SIGTERM": 143}

_SIGNAL_WORDS = {"SIGINT": "Ctrl-C", "SIGTERM": "SIGTERM"}

#: The key of a run's `LastEvaluation` in its latest checkpoints.
LAST_EVALUATION = "last_evaluation"


def check_same_run(run_dir: Path, config: Config) -> list[str]:
    """Refuse to continue a run in ``run_dir`` with a config that differs from the one it was started with.

    A run that has written a checkpoint is continued only with its own config, but for the progress bar and the
    layout (placement, mesh, rules: the checkpoint restores onto any): another learning rate, schedule length,
    model or data order would make one record of two runs. The error lists every difference. Returns the layout's
    changes (``"trainer.placement: 'single' -> 'fsdp'"``), for the run to say so.

    Examples:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from ember.cli import load_config
        >>> from ember.cli._run_record import check_same_run
        >>> check_same_run(Path(tempfile.mkdtemp()), load_config())  # a new folder: nothing to compare
        []
    """
    saved_file = run_dir / "config.yaml"
    latest = run_dir / "checkpoints" / "latest"
    started = latest.is_dir() and any((c / "manifest.json").exists() for c in latest.iterdir())
    if not started or not saved_file.exists():
        return []
    saved = dataclasses.asdict(load_config(saved_file))
    changes = [
        (path, f"{path}: {old!r} -> {new!r}")
        for path, old, new in _differences(saved, dataclasses.asdict(config))
        if path not in COSMETIC
    ]
    differences = [text for path, text in changes if path not in LAYOUT]
    if differences:
        raise ConfigError(
            f"{run_dir} holds a run started with another config ({'; '.join(differences)}). Continuing it with "
            "these changes would make one run of two configs. Train into a new folder (set output:), or "
            f"delete {run_dir} to start over."
        )
    return [text for path, text in changes if path in LAYOUT]


def _differences(old: Any, new: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = list(old) + [k for k in new if k not in old]
        return [d for k in keys for d in _differences(old.get(k), new.get(k), f"{path}.{k}" if path else k)]
    return [] if old == new else [(path, old, new)]


def saved_summary(run_dir: Path) -> dict[str, Any] | None:
    """The ``summary.json`` of a run folder, or ``None``."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def finished_run(run_dir: Path, config: Config) -> dict[str, Any] | None:
    """The summary of the run in ``run_dir`` if it is finished with ``config``, read from its files alone; else None.

    Finished: its summary says it ran to its end (or a handler ended it), not that a signal stopped it, and its
    latest checkpoint is the summary's last iteration. ``ember train`` answers a relaunch of such a run without
    importing JAX.

    Examples:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from ember.cli import load_config
        >>> from ember.cli._run_record import finished_run
        >>> print(finished_run(Path(tempfile.mkdtemp()), load_config()))
        None
    """
    summary = saved_summary(run_dir)
    if summary is None or stopped_by_signal(summary) or "iterations" not in summary:
        return None
    check_same_run(run_dir, config)
    last = run_dir / "checkpoints" / "latest" / f"step_{summary['iterations']:08d}" / "manifest.json"
    return summary if last.exists() else None


def stopped_by_signal(summary: dict[str, Any]) -> bool:
    """Whether a run's summary says a signal stopped it (here or on another process): a relaunch trains on.

    Examples:
        >>> from ember.cli._run_record import stopped_by_signal
        >>> stopped_by_signal({"stopped": "SIGTERM"}), stopped_by_signal({"stopped": "early stopping"})
        (True, False)
    """
    stopped = summary.get("stopped")
    return isinstance(stopped, str) and stopped.startswith(("SIG", "a signal"))


def closing_line(summary: dict[str, Any]) -> str:
    """The line ``ember train`` ends with: what ran, the best accuracy and the folder, or how to resume.

    Examples:
        >>> from ember.cli._run_record import closing_line
        >>> closing_line({"epochs": 2, "iterations": 44, "seconds": 3.1, "best_accuracy": 0.9, "run_dir": "r"})
        'Done: 2 epochs, 44 iterations in 3.1 s; best val accuracy 0.9000. Run folder: r'
    """
    best, on = summary["best_accuracy"], summary.get("best_on", "val")
    shown = "none yet (no evaluation finished)" if best is None else f"{best:.4f}"
    if stopped_by_signal(summary):
        stopped = summary["stopped"]
        return (
            f"Stopped at iteration {summary['iterations']} ({_SIGNAL_WORDS.get(stopped, stopped)}), the checkpoint "
            f"saved; run the same command to resume. Best {on} accuracy {shown}. Run folder: {summary['run_dir']}"
        )
    return (
        f"Done: {summary['epochs']} epochs, {summary['iterations']} iterations in {summary['seconds']} s; "
        f"best {on} accuracy {shown}. Run folder: {summary['run_dir']}"
    )


class LastEvaluation:
    """The numbers of a run's last validation, carried in its latest checkpoints: the run's result through relaunches.

    ``ember train`` updates it at each validation and puts it in the latest checkpoints (a run folder begun without it
    goes on without). Its ``hparams`` record and its summary's ``final_accuracy`` read it at the end, so a relaunch
    that does not validate again before its end still reports the run's last validation, as an uninterrupted run does.

    Examples:
        >>> from ember.cli._run_record import LastEvaluation
        >>> last = LastEvaluation()
        >>> last.seen({"accuracy": 0.91, "loss": 0.3, "precision": 0.9}); last.state_dict()
        {'metrics': {'accuracy': 0.91, 'loss': 0.3}}
        >>> relaunched = LastEvaluation()
        >>> relaunched.load_state_dict(last.state_dict()); relaunched.metrics["accuracy"]
        0.91
    """

    #: The validation numbers kept: those the ``hparams`` record and the summary report.
    KEPT = ("accuracy", "loss")

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    def seen(self, metrics: dict[str, Any]) -> None:
        """A validation ended with ``metrics``."""
        self.metrics = {k: float(metrics[k]) for k in self.KEPT if k in metrics}

    def state_dict(self) -> dict[str, Any]:
        """``{"metrics": {"accuracy": ..., "loss": ...}}``; empty before the first validation."""
        return {"metrics": dict(self.metrics)}

    def load_state_dict(self, state_dict: Any) -> None:
        """Take the numbers a checkpoint kept."""
        metrics = state_dict.get("metrics") if isinstance(state_dict, dict) else None
        if not isinstance(metrics, dict) or not all(isinstance(v, int | float) for v in metrics.values()):
            raise ValueError(f"A run's last evaluation must be {{'metrics': {{name: number}}}}, got {state_dict!r}.")
        self.metrics = {str(k): float(v) for k, v in metrics.items()}
