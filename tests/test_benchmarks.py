import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def run_benchmark(script: str, *args: str, timeout: int) -> str:
    """The standard output of ``benchmarks/<script> <args>``, run to completion in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args], capture_output=True, text=True, check=True, timeout=timeout
    )
    return done.stdout


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


def test_workloads_benchmark_runs_both_sides_and_reports_them():
    """Two epochs, one repeat: each side's run, first epoch and later epochs, each with its speed; nothing timed."""
    out = run_benchmark("workloads.py", "--workloads", "digits,chars", "--epochs", "2", "--repeats", "1", timeout=600)
    cell, one = r"[\d.]+ \([\d.]+-[\d.]+\)", r"1\.000 \(1\.000-1\.000\)"
    for workload in ("digits", "chars"):
        ember = rf"^{workload} \| 2 \| ember( \| {cell}){{6}}$"
        hand = rf"^{workload} \| 2 \| hand loop \| {cell} \| {one} \| {cell} \| {one} \| {cell} \| {one}$"
        assert re.search(ember, out, re.M), out
        assert re.search(hand, out, re.M), out
    assert re.search(rf"^digits \| 2 \| keras fit( \| {cell}){{6}}$", out, re.M), out
    assert re.search(
        rf"^digits: ember's speed vs Keras fit, median \(min-max\): run {cell}, later epochs {cell}$", out, re.M
    )
    assert "workload | epochs | side | run, s | speed vs the hand loop | first epoch, s |" in out


def test_workloads_benchmark_names_an_unknown_workload():
    """An unknown workload is refused with the list of workloads."""
    done = subprocess.run(
        [sys.executable, str(BENCH / "workloads.py"), "--workloads", "resnet50"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 2
    assert "error: unknown workload 'resnet50'; the workloads are ['chars', 'digits', 'lm', 'resnet']" in done.stderr


def test_the_accelerator_workloads_run_at_smoke_size_on_both_sides():
    """Lm and resnet, each side once at a toy size: the table and the JSON line; on CPU no MFU and no memory peak."""
    out = run_benchmark("workloads.py", "--workloads", "lm,resnet", "--smoke", timeout=600)
    for workload, unit in (("lm", "tokens"), ("resnet", "images")):
        assert f"| side | steps/s | {unit}/s | MFU | device memory peak | vs hand loop |" in out
        assert re.search(rf"^{workload}: 2 steps per window, median of the windows; cpu x1, jax ", out, re.M)
        assert re.search(r"^\| ember \| [\d.]+ \| [\d,]+ \| n/a \| n/a \| [\d.]+x \|$", out, re.M), out
        assert re.search(r"^\| hand loop \| [\d.]+ \| [\d,]+ \| n/a \| n/a \| 1\.000x \|$", out, re.M), out
        row = json.loads(next(line for line in out.splitlines() if line.startswith(f'{{"{workload}"')))[workload]
        assert row["hand loop"]["ratio_to_hand"] == 1.0
        assert row["ember"][f"{unit}_per_s"] == pytest.approx(
            row["ember"]["steps_per_s"] * (128 if unit == "tokens" else 4)
        )
    assert re.search(r"^lm: [\d,]+ parameters; Size\(width=32, blocks=1, ", out, re.M)
    assert re.search(r"^resnet: [\d,]+ parameters; Size\(image=16, width=4, ", out, re.M)


def test_sharded_benchmark_runs_both_sides_and_the_memory_table():
    """Two steps, one repeat, on 8 simulated devices: both sides and both placements reported; nothing timed."""
    out = run_benchmark("sharded.py", "--steps", "2", "--repeats", "1", timeout=600)
    assert "8 cpu devices" in out.splitlines()[0]
    assert re.search(r"^ember fsdp\(\) +[\d.]+ steps/s +[\d.]+ x hand", out, re.M), out
    fullest = dict(re.findall(r"^(replicated|FSDP).* ([\d.]+) MiB on the fullest device$", out, re.M))
    assert float(fullest["FSDP"]) < float(fullest["replicated"]) / 4


def test_host_cost_benchmark_reports_the_added_microseconds():
    """A few hundred steps, one repeat: the three rows and ember's added microseconds; nothing is timed."""
    out = run_benchmark("host_cost.py", "--steps", "200", "--repeats", "1", timeout=300)
    for reference in ("hand loop", "hand loop, metrics"):
        assert re.search(rf"^{reference} +[\d.]+ us/step \(best\) +[\d.]+ \(median\)$", out, re.M), out
    for row in ("ember", r"ember \+ handlers"):
        assert re.search(
            rf"^{row} +[\d.]+ us/step .* added: [+-][\d.]+ \(best\) / [+-][\d.]+ \(median\) us$", out, re.M
        )


def test_data_benchmark_reports_each_way_of_feeding_the_step():
    """Two epochs, one repeat, one worker: the three rows with their ratio and waiting time; nothing is timed."""
    out = run_benchmark("data.py", "--epochs", "2", "--repeats", "1", "--workers", "1", timeout=300)
    for row in ("memory", "grain", "grain_inline"):
        assert re.search(
            rf"^  {row} +[\d.]+ ms/step   throughput x[\d.]+ of memory   waiting for data [\d.]+ ms/step$", out, re.M
        ), out


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
