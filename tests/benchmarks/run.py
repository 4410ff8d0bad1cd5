"""Runs a script of `benchmarks/` in a fresh interpreter, for the tests that check each one runs and reports."""

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"

# The tests check that each script runs and what it reports, never how fast: its programs, compiled again in every
# fresh process and run a few steps each, compile without LLVM's optimisation. That takes a fifth off these tests
# (150 s to 118 s in one process); `benchmarks/` run as written measure the compiler's default.
UNOPTIMISED = "--xla_backend_optimization_level=0"


def run_benchmark(script: str, *args: str, timeout: int) -> str:
    """The standard output of ``benchmarks/<script> <args>``, run to completion in a fresh interpreter."""
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {UNOPTIMISED}".lstrip()}
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout,
        env=env,
    )
    return done.stdout
