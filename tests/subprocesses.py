"""Running Python (a script, ``-m ember.cli ...``) in a fresh interpreter from the repository's root, for the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_python(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    prefix: Sequence[str] = (),
    timeout: float = 300,
    cwd: str | os.PathLike[str] = ROOT,
) -> subprocess.CompletedProcess[str]:
    """``python *args`` (after the command ``prefix``, if any) with the repository importable; its output captured.

    ``env`` adds to the current environment; ``cwd`` is the repository's root unless given. The run is bounded by
    ``timeout`` seconds; its exit status is the caller's to check (``assert done.returncode == 0, done.stderr``).
    """
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [*prefix, sys.executable, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie waiting to be reaped (from /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
