"""`benchmarks/workloads.py` and `sharded.py`: realistic workloads beside the hand loop and Keras; sharding."""

import json
import re
import subprocess
import sys

import pytest

from tests.benchmarks.run import BENCH, run_benchmark


def test_workloads_benchmark_runs_both_sides_and_reports_them():
    """Two epochs, one repeat, no warm-up: each side's run, first epoch and later epochs, with speeds; nothing timed."""
    out = run_benchmark(
        "workloads.py", "--workloads", "digits,chars", "--epochs", "2", "--repeats", "1", "--smoke", timeout=600
    )
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
