"""`benchmarks/first_step.py` and `step_program.py` at smoke size.

A fresh process's first step, the command's quick answers, the compilation cache, the step's program.
"""

import re

from tests.benchmarks.run import run_benchmark


def test_first_step_benchmark_times_a_fresh_process_of_each_side():
    """One repeat: both sides train the digits CNN for one step in a fresh process; the report names both."""
    out = run_benchmark("first_step.py", "--repeats", "1", timeout=300)
    assert re.search(r"^hand loop +median [\d.]+ s \(min [\d.]+, max [\d.]+\)$", out, re.M), out
    assert re.search(r"^ember +median [\d.]+ s .* [+-][\d.]+% over the hand loop$", out, re.M), out


def test_first_step_benchmark_times_the_commands_quick_answers():
    """--cli, one repeat: the bare interpreter and the three answers that import no JAX, each with its ratio."""
    out = run_benchmark("first_step.py", "--cli", "--repeats", "1", timeout=300)
    names = [
        m.group(1).strip()
        for m in re.finditer(r"^(.+?) +median [\d.]+ s \(min [\d.]+, max [\d.]+\), [\d.]+x$", out, re.M)
    ]
    assert names == ["python -c pass", "ember --version", "a config typo", "a finished run", "the digits run"], out


def test_first_step_benchmark_times_the_compilation_cache_off_empty_and_filled():
    """--cache, one repeat: a one-epoch run with the cache off, empty and filled, each against the run without."""
    out = run_benchmark("first_step.py", "--cache", "--repeats", "1", timeout=300)
    names = [
        m.group(1).strip()
        for m in re.finditer(r"^(.+?) +median [\d.]+ s \(min [\d.]+, max [\d.]+\), [+-][\d.]+ s$", out, re.M)
    ]
    assert names == ["off", "empty (a first run)", "filled (a relaunch)"], out


def test_step_program_fingerprints_each_configuration_the_same_way_twice():
    """Four configurations, each a program's length and fingerprint; a second run prints the very same lines."""
    first = run_benchmark("step_program.py", timeout=300)
    lines = first.splitlines()[1:]
    assert len(lines) == 4
    for line, precision in zip(lines, ("32-true", "16-mixed", "bf16-mixed", "32-true"), strict=True):
        assert re.fullmatch(
            rf"{precision}, accumulate \d, remat \S+, guard (True|False) +\d+ lines  [0-9a-f]{{16}}", line
        )
    assert run_benchmark("step_program.py", timeout=300) == first
