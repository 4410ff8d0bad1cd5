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


#: The suite's programs compile without LLVM's optimisation (`tests/conftest.py` sets it for the whole run, and every
#: process the tests start inherits it or is given it by `devices`): the tests check what a program computes, never
#: how fast, and their programs are compiled in many fresh processes and run a few steps each. Compiling costs about
#: 40% less CPU (`ember train`, 3 epochs, no compilation cache: 9.7 s of CPU against 5.9). The numbers differ from an
#: optimised build's in the last bits, as on another CPU (the digits run, 2 epochs: parameters within 3.4e-6); what the
#: tests compare (a run and its resume, one device and eight) is compiled alike on both sides. The two examples that
#: train long enough for the optimisation to pay for itself run optimised (`tests/test_examples.py`).
UNOPTIMISED = "--xla_backend_optimization_level=0"


def devices(n: int, *flags: str) -> str:
    """``XLA_FLAGS`` for ``n`` simulated CPU devices (and ``flags``), compiled as the rest of the suite compiles.

    Examples:
        >>> devices(2)
        '--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0'
    """
    return " ".join((f"--xla_force_host_platform_device_count={n}", *flags, UNOPTIMISED))


# A collective over the simulated devices waits up to 300 s for its peers (40 s by default): a busy 2-core machine
# can exceed 40 s.
EIGHT_DEVICES = devices(8, "--xla_cpu_collective_call_terminate_timeout_seconds=300")


class SharedResults(dict):
    """A script's results that many tests read, or its failure: then one test fails with it, not every test.

    The first test to read a result from a failed script fails with the script's evidence; the tests after it are
    skipped, naming that failure. One slow or broken script is one failure in the report, not twenty errors.
    """

    def __init__(self, results: dict | None = None, failure: str | None = None) -> None:
        super().__init__(results or {})
        self.failure, self.told = failure, False

    def __getitem__(self, key: str):
        if self.failure is not None:
            if not self.told:
                self.told = True
                raise AssertionError(self.failure)
            import pytest

            pytest.skip(f"the script these results come from failed in an earlier test: {self.failure[:200]}")
        return super().__getitem__(key)


def _cpu_seconds(pid: int) -> float:
    """The CPU time process ``pid`` (all its threads) has used, from /proc; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_while_progressing(
    command: Sequence[str], env: Mapping[str, str], *, quiet: float = 300.0, limit: float = 3600.0
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` to its end, bounded by its progress rather than by a total time.

    It is ended once it has used no CPU time and written no output for ``quiet`` seconds (stuck), or after ``limit``
    in all; then ``TimeoutError``, with the tail of its output.

    A heavily loaded machine slows a script down but does not stop its progress: a total deadline that a quiet
    machine meets three times over can still pass there, where this one does not.
    """
    import time

    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as proc:
        chunks: dict[str, list[str]] = {"out": [], "err": []}
        readers = [
            threading.Thread(target=lambda name=name, pipe=pipe: chunks[name].extend(pipe), daemon=True)
            for name, pipe in (("out", proc.stdout), ("err", proc.stderr))
        ]
        for reader in readers:
            reader.start()
        started = last = time.monotonic()
        seen = (0.0, 0)
        while proc.poll() is None:
            now = time.monotonic()
            progress = (_cpu_seconds(proc.pid), len(chunks["out"]) + len(chunks["err"]))
            if progress != seen:
                seen, last = progress, now
            if now - last > quiet or now - started > limit:
                end_group(proc.pid)
                proc.wait(timeout=30)
                why = f"no progress for {quiet:g} s" if now - last > quiet else f"still running after {limit:g} s"
                raise TimeoutError(f"{command[-1]}: {why}; its last output:\n{''.join(chunks['err'])[-3000:]}")
            time.sleep(1.0)
        for reader in readers:
            reader.join(timeout=30)
    return subprocess.CompletedProcess(command, proc.returncode, "".join(chunks["out"]), "".join(chunks["err"]))


def eight_device_results(script: Path) -> SharedResults:
    """The JSON object the last line of ``script`` prints, run in a fresh interpreter with 8 simulated CPU devices.

    Bounded by progress (`run_while_progressing`); a failure is one test's (`SharedResults`).
    """
    env = {**os.environ, "XLA_FLAGS": EIGHT_DEVICES, "JAX_PLATFORMS": "cpu"}
    try:
        proc = run_while_progressing([sys.executable, "-W", "error", str(script)], env)
    except TimeoutError as e:
        return SharedResults(failure=str(e))
    if proc.returncode != 0:
        return SharedResults(failure=f"{script.name} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return SharedResults(json.loads(proc.stdout.strip().splitlines()[-1]))
