"""Runs a script of `benchmarks/` in a fresh interpreter, for the tests that check each one runs and reports."""

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def run_benchmark(script: str, *args: str, timeout: int) -> str:
    """The standard output of ``benchmarks/<script> <args>``, run to completion in a fresh interpreter.

    It checks that the script runs and what it reports, never how fast: its programs compile as the whole suite's do
    (`tests.subprocesses.UNOPTIMISED`); `benchmarks/` run as written measure the compiler's default.
    """
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout,
    )
    return done.stdout
