"""A run folder's identity, in ``run.json``: the run's id and the tracker runs (MLflow, W&B) that hold its record.

A relaunch reads the same file, so one training is one MLflow run and one W&B run however often it is relaunched.
The file is replaced atomically (a temporary file, fsynced, renamed); one that cannot be read (altered by hand,
truncated) is moved aside with a warning naming it, and the run gets a new identity: its trackers start new runs,
nothing the old file said is deleted.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from ember._atomic_file import replace_file

#: The identity's file in a run folder.
FILENAME = "run.json"


def run_identity(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The identity of the run in ``run_dir``, written there if it is new: its id, where it was made, its trackers.

    ``{"id": "3fa9...", "path": "/abs/runs/digits", "trackers": {"mlflow": ...}}``: the id names the run (its W&B
    run, its group), the path is the folder's absolute path when the run was made.

    Examples:
        >>> import os, tempfile
        >>> from ember._run_identity import run_identity
        >>> folder = tempfile.mkdtemp()
        >>> first = run_identity(folder)
        >>> run_identity(folder) == first, len(first["id"]), first["trackers"]
        (True, 16, {})
        >>> first["path"] == os.path.realpath(folder)  # where the run was made
        True
    """
    root = Path(run_dir)
    path = root / FILENAME
    try:
        identity = json.loads(path.read_text())
    except FileNotFoundError:
        identity = None
    except (OSError, ValueError) as e:
        identity = _set_aside(path, f"it cannot be read ({e})")
    if identity is not None and not _valid(identity):
        identity = _set_aside(path, "it does not hold a run id")
    if identity is None:
        identity = {"id": uuid.uuid4().hex[:16], "path": str(root.resolve()), "trackers": {}}
        root.mkdir(parents=True, exist_ok=True)
        replace_file(root, FILENAME, json.dumps(identity, indent=1))
    return identity


def tracker_run(run_dir: str | os.PathLike[str], tracker: str) -> str | None:
    """The id of ``tracker``'s run (``"mlflow"``, ``"wandb"``) that holds this run's record, if one was started.

    Examples:
        >>> import tempfile
        >>> from ember._run_identity import remember_tracker_run, tracker_run
        >>> folder = tempfile.mkdtemp()
        >>> print(tracker_run(folder, "mlflow"))
        None
        >>> remember_tracker_run(folder, "mlflow", "4f2a"); tracker_run(folder, "mlflow")
        '4f2a'
    """
    found = run_identity(run_dir)["trackers"].get(tracker)
    return found if isinstance(found, str) else None


def remember_tracker_run(run_dir: str | os.PathLike[str], tracker: str, run_id: str) -> None:
    """Write into ``run.json`` that ``tracker``'s run ``run_id`` holds this run's record (a relaunch continues it)."""
    identity = run_identity(run_dir)
    identity["trackers"][tracker] = run_id
    replace_file(Path(run_dir), FILENAME, json.dumps(identity, indent=1))


def _valid(identity: Any) -> bool:
    """Whether a parsed ``run.json`` holds a run id (and, if any, a mapping of tracker runs)."""
    if not isinstance(identity, dict) or not isinstance(identity.get("id"), str):
        return False
    if not re.fullmatch(r"[0-9A-Za-z_-]{1,64}", identity["id"]):  # it names folders (the fast tier's) and runs
        return False
    return isinstance(identity.setdefault("trackers", {}), dict)


def _set_aside(path: Path, why: str) -> None:
    """Move a ``run.json`` that cannot be used aside (``run.json.damaged-<time>``), saying so; returns ``None``."""
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}")
    os.replace(path, aside)
    warnings.warn(
        f"{path}: {why}; moved to {aside.name}. The run gets a new identity: its MLflow and W&B records start new "
        "runs.",
        RuntimeWarning,
        stacklevel=3,
    )
