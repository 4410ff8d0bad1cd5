"""The host-side benchmarks at smoke size, each reporting every row.

The engine's overhead, checkpoints, prefetch, metrics, throughput, host cost, data, Orbax, handler costs.
"""

import re
import subprocess
import sys

from tests.benchmarks.run import BENCH, run_benchmark


def test_engine_overhead_benchmark_runs_and_reports_every_case():
    """The benchmark script runs (tiny sizes, no timing asserted) and reports each case and derived number."""
    out = run_benchmark("engine_overhead.py", "--iters", "2000", "--repeats", "1", timeout=120)
    for line in ("bare loop:", "ember:", "no handlers", "5 handlers", "5 x every=100", "20 x every=100"):
        assert line in out
    assert out.count("per every=100 handler per iteration") >= 2


def test_checkpoint_benchmark_runs_and_reports_every_measure():
    """A small state (--quick): every measure and its target is reported; no timing is asserted."""
    out = run_benchmark("checkpoint.py", "--quick", timeout=300)
    for line in (
        "d2h copy",
        "blocked per save",
        "write to disk",
        "x raw",
        "restore (verified)",
        "device_snapshot=True: blocked",
        "fast tier (",
        "x the durable save's), call to on disk",
        "time over the time without",
        "host copy (default)",
    ):
        assert line in out


def test_prefetch_benchmark_runs_and_reports_each_case():
    """Two tiny cases (--quick): each reports all three settings and both ratios; no timing is asserted."""
    out = run_benchmark("prefetch.py", "--quick", "--repeats", "1", timeout=300)
    lines = [line for line in out.splitlines() if "MB per call" in line]
    assert len(lines) == 2
    assert all("prefetch=0" in line and "=None" in line and "auto/best" in line for line in lines)


def test_metrics_overhead_benchmark_runs_and_reports_every_row():
    """A few steps: each metric set is reported with its best and median time and the excess; no timing asserted."""
    out = run_benchmark("metrics_overhead.py", "--steps", "20", "--repeats", "2", timeout=300)
    rows = [line for line in out.splitlines() if line.startswith("  ")]
    assert [row.split("best")[0].strip() for row in rows] == [
        "no metrics (outputs only)",
        "Average of the loss",
        "Accuracy",
        "RunningAverage of the loss",
        "all three",
    ]
    assert "(+ 0.0)" in rows[0]


def test_throughput_benchmark_runs_and_reports_every_ember_row():
    """The tiny model at smoke-test size (--quick): every ember row and its reference ratio; no timing asserted."""
    out = run_benchmark("throughput.py", "--quick", "--repeats", "1", "--models", "tiny", timeout=300)
    rows: dict[str, list[str]] = {}
    for line in out.splitlines():
        found = re.match(r"^  (\S.*?)\s{2,}\d+ steps/s(.*)$", line)
        if found:
            rows.setdefault(found[1], []).append(found[2])
    for row, ref in (
        ("ember", "hand loop"),
        ("ember + handlers", "hand loop"),
        ("ember + metrics", "ember, aux outputs"),
        ("hand loop + metrics in its step", "hand loop, aux outputs"),
        ("ember steps_per_call=10", "hand scan x10"),
        ("ember steps_per_call=10 + handlers", "hand scan x10"),
    ):
        assert len(rows[row]) == 1
        assert f"x {ref} (median" in rows[row][0]
    assert rows["hand loop"] == [""]


def test_throughput_benchmark_runs_only_the_rows_asked_for_with_their_references():
    """``--rows`` keeps the named rows and the rows they are measured against, on the models ``--models`` picks."""
    out = run_benchmark(
        "throughput.py", "--quick", "--repeats", "1", "--models", "tiny", "--rows", "ember + metrics", timeout=300
    )
    rows = re.findall(r"^  (\S.*?)\s{2,}\d+ steps/s", out, flags=re.M)
    assert rows == ["ember, aux outputs", "ember + metrics"]
    assert out.count("MLP") == 1
    assert "tiny MLP 784-32-10: batch 32, 40 steps, 1 repeats" in out


def test_throughput_benchmark_names_an_unknown_row_or_model():
    def fails(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, str(BENCH / "throughput.py"), "--quick", *args],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 1
        return done.stderr

    assert "--rows: no row named ['ember + typo']; the rows are ['hand loop', 'ember', " in fails(
        "--models", "512", "--rows", "ember + typo"
    )
    assert "--models: expected tiny, 512 or tiny,512, got 'tiny,1024'" in fails("--models", "tiny,1024")


def test_host_cost_benchmark_reports_the_added_microseconds():
    """A few hundred steps, one repeat: the three rows and ember's added microseconds; nothing is timed."""
    out = run_benchmark("host_cost.py", "--steps", "200", "--repeats", "1", timeout=300)
    for reference in ("hand loop", "hand loop, metrics"):
        assert re.search(rf"^{reference} +[\d.]+ us/step \(best\) +[\d.]+ \(median\)$", out, re.M), out
    for row in ("ember", r"ember \+ handlers", r"ember \+ handlers \+ stragglers"):
        assert re.search(
            rf"^{row} +[\d.]+ us/step .* added: [+-][\d.]+ \(best\) / [+-][\d.]+ \(median\) us$", out, re.M
        )


def test_data_benchmark_reports_each_way_of_feeding_the_step():
    """Two epochs, one repeat, one worker, no warm-up: the three rows with their ratio and waiting time; not timed."""
    out = run_benchmark("data.py", "--epochs", "2", "--repeats", "1", "--workers", "1", "--smoke", timeout=300)
    for row in ("memory", "grain", "grain_inline"):
        assert re.search(
            rf"^  {row} +[\d.]+ ms/step   throughput x[\d.]+ of memory   waiting for data [\d.]+ ms/step$", out, re.M
        ), out


def test_orbax_checks_benchmark_runs_and_reports_both_rows():
    """A small tree: the save and the restore rows, each with both sides and the ratio; no timing asserted."""
    out = run_benchmark("orbax_checks.py", "--mb", "8", "--repeats", "2", timeout=300)
    rows = [line.split()[0] for line in out.splitlines() if "ember / orbax" in line]
    assert rows == ["save", "restore"]


def test_handler_costs_benchmark_runs_and_reports_each_part():
    """`ember train` whole and without each part named (2 epochs, 1 repeat): a row per part, no timing asserted."""
    out = run_benchmark(
        "handler_costs.py", "--epochs", "2", "--repeats", "1", "--parts", "nan_guard,stall", timeout=300
    )
    rows = [line.split(" | ")[0] for line in out.splitlines()[2:]]
    assert rows == ["all", "nan_guard", "stall", "together (every default part, the stall watchdog aside)"]
    assert "TerminateOnNan on the loss" in out


def test_handler_costs_benchmark_reports_cpu_time_per_handler_and_thread():
    """--cpu, 2 epochs: a row per handler on the training thread, their sum, and the threads; no timing asserted."""
    out = run_benchmark("handler_costs.py", "--cpu", "--epochs", "2", timeout=300)
    lines = out.splitlines()
    assert lines[1] == "on the training thread, by handler | µs per step"
    assert any(line.startswith("Evaluate | ") for line in lines), out
    assert any(line.startswith("every handler together | ") for line in lines), out
    assert any(line.startswith("MainThread | ") for line in lines[lines.index("by thread | µs per step") :]), out
