"""Running Python (a script, ``-m ember.cli ...``) in a fresh interpreter from the repository's root, for the tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: What a test's subprocess imports from: this checkout's ``src`` (not an ember installed from another one) and its
#: root (``tests``).
PYTHONPATH = os.pathsep.join([str(ROOT / "src"), str(ROOT)])


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
    environment = {**os.environ, "PYTHONPATH": PYTHONPATH, **(env or {})}
    command = [*prefix, sys.executable, *args]
    # its own process group: whatever it started (a launcher's workers, Grain's) ends with it, even on a timeout
    with subprocess.Popen(
        command, cwd=cwd, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    ) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            end_group(proc.pid)
            proc.communicate(timeout=30)
            raise
        finally:
            end_group(proc.pid)  # anything left behind by a run that ended
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def end_group(pgid: int) -> None:
    """SIGKILL every process left in the process group ``pgid`` (none left: nothing to do)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie waiting to be reaped (from /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def ember_train_signalled(
    args: Sequence[str],
    sig: int | None = None,
    wait_for: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] = ROOT,
    command: str = "train",
) -> tuple[int, str, str]:
    """``ember train ARGS`` in a fresh process; ``sig`` once a line starting with ``wait_for`` is printed.

    ``command`` runs another subcommand (``eval``). ``env`` adds to our environment; the process runs in ``cwd`` (the
    repository's root by default).

    Returns ``(status, out, err)``. The whole run is bounded (240 s): a hang fails the test, never blocks it.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "ember.cli", command, *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": PYTHONPATH, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    timer = threading.Timer(240, proc.kill)
    timer.start()
    try:
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if sig is not None and wait_for is not None and line.startswith(wait_for):
                proc.send_signal(sig)
                break
        out, err = proc.communicate(timeout=240)
    finally:
        timer.cancel()
    return proc.returncode, "".join(lines) + out, err


# A collective over the simulated devices waits up to 300 s for its peers (40 s by default): a busy 2-core machine
# can exceed 40 s.
EIGHT_DEVICES = "--xla_force_host_platform_device_count=8 --xla_cpu_collective_call_terminate_timeout_seconds=300"


def eight_device_results(script: Path) -> dict:
    """The JSON object the last line of ``script`` prints, run in a fresh interpreter with 8 simulated CPU devices."""
    env = {**os.environ, "XLA_FLAGS": EIGHT_DEVICES, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(script)], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
