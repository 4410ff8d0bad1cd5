"""Launch a script as N ``jax.distributed`` processes on localhost and collect their ``RESULT {json}`` lines."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from tests.subprocesses import end_group

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return str(s.getsockname()[1])


def launch(script: Path, nproc: int, workdir: Path, *extra: str, timeout: float = 240) -> list[dict]:
    """Run ``script PID NPROC PORT WORKDIR *extra`` once per process; every wait is bounded by ``timeout``.

    Output goes to files in ``workdir`` (``process-<pid>.out`` / ``.err``), not pipes: a process blocked on
    a full pipe that nobody reads would stall its peers in their collectives.
    """
    port = free_port()
    procs, files = [], []
    for pid in range(nproc):
        out, err = open(workdir / f"process-{pid}.out", "w"), open(workdir / f"process-{pid}.err", "w")  # noqa: SIM115
        files += [out, err]
        args = [sys.executable, str(script), str(pid), str(nproc), port, str(workdir), *extra]
        procs.append(subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=err, text=True, start_new_session=True))
    try:
        for proc in procs:
            proc.wait(timeout=timeout)  # a hang fails here instead of blocking the suite
    finally:
        for proc in procs:  # each its own process group: what it started ends with it
            end_group(proc.pid)
            proc.wait(timeout=30)
        for f in files:
            f.close()
    results = []
    for pid, proc in enumerate(procs):
        assert proc.returncode == 0, (workdir / f"process-{pid}.err").read_text()[-3000:]
        stdout = (workdir / f"process-{pid}.out").read_text()
        line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT ") :]))
    return results
