"""Through the library: a script's logs, SIGKILLed at any point and relaunched, equal the uninterrupted run's."""

import csv
import json

import pytest

from tests.subprocesses import ROOT, run_python
from tests.writers.tb_reader import tensorboard_scalars

SCRIPT = str(ROOT / "tests" / "writers" / "records_script.py")


def record(run_dir):
    """The JSONL records (without their wall time), the CSV rows and TensorBoard's curves of a run folder."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    with (run_dir / "metrics.csv").open() as f:
        rows = list(csv.reader(f))
    jsonl = [{k: v for k, v in json.loads(line).items() if k != "time"} for line in lines]
    return jsonl, rows, tensorboard_scalars(run_dir / "tb")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight")
    done = run_python([SCRIPT, str(run_dir)])
    assert done.returncode == 0, done.stderr[-3000:]
    return record(run_dir)


@pytest.mark.parametrize(
    "kill_at",
    [
        3,  # before the first checkpoint: the relaunch starts over
        5,  # as the first checkpoint is written in the background: resumed from it, or from nothing
        14,  # mid-way: steps 11-14 logged past the checkpoint of 10
    ],
)
def test_a_killed_and_relaunched_library_run_logs_each_record_of_the_uninterrupted_run_once(
    tmp_path, uninterrupted, kill_at
):
    killed = run_python([SCRIPT, str(tmp_path), str(kill_at)])
    assert killed.returncode == -9, killed.stderr[-3000:]
    if kill_at >= 5:  # flushed before the checkpoint of 5: on disk when it died (before, within flush_secs)
        assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[1])["step"] == 4
    again = run_python([SCRIPT, str(tmp_path)])
    assert again.returncode == 0, again.stderr[-3000:]
    jsonl, rows, curves = record(tmp_path)
    expected_jsonl, expected_rows, expected_curves = uninterrupted
    assert [r["step"] for r in jsonl] == list(range(2, 25, 2))
    assert jsonl == expected_jsonl
    assert rows == expected_rows
    assert list(curves) == ["train/loss"]
    assert curves == expected_curves
