"""Training on jax.distributed: 2 processes x 2 CPU devices against 1 process x 4 devices (Gloo, localhost)."""

import json
from pathlib import Path

import numpy as np
import pytest

from tests.distributed.launch import launch

SCRIPT = Path(__file__).with_name("training_script.py")


def _run(nproc: int, workdir: Path, *extra: str) -> list[dict]:
    return launch(SCRIPT, nproc, workdir, *extra)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    one, two = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    return {"one": _run(1, one), "two": _run(2, two), "two_dir": two}


def test_both_processes_end_with_the_parameters_of_a_4_device_run(runs):
    (ref,), (p0, p1) = runs["one"], runs["two"]
    assert p0["params"] == p1["params"]  # identical, not just close: one global computation
    for a, b in zip(ref["params"], p0["params"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert (p0["local_batch"], p1["local_batch"], ref["local_batch"]) == (8, 8, 16)


def test_a_grain_pipeline_per_process_trains_as_one_process_on_the_same_global_batches(runs, tmp_path):
    """Each process reads its part of every batch through Grain workers; the result is the 4-device run's."""
    (ref,) = runs["one"]
    p0, p1 = _run(2, tmp_path, "grain")
    assert p0["params"] == p1["params"]
    for a, b in zip(ref["params"], p0["params"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert (p0["local_batch"], p1["local_batch"]) == (8, 8)


def test_metrics_are_global_on_every_process(runs):
    (ref,), (p0, p1) = runs["one"], runs["two"]
    assert p0["metrics"] == p1["metrics"]
    assert p0["metrics"] == pytest.approx(ref["metrics"], rel=1e-5)


def test_exactly_one_set_of_logs_and_checkpoints(runs):
    """Both processes log and checkpoint into the same folder; only process 0 writes."""
    rows = (runs["two_dir"] / "log.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [4, 8, 12]
    assert sorted(p.name for p in (runs["two_dir"] / "ckpt").iterdir()) == [
        "step_00000004",
        "step_00000008",
        "step_00000012",
    ]


def test_state_sharded_across_processes_is_refused_by_the_msgpack_store(runs):
    (ref,), (p0, p1) = runs["one"], runs["two"]
    assert ref["sharded_error"] is None  # one process: every shard is here
    for p in (p0, p1):
        assert p["sharded_error"] == (
            "Checkpoint leaf ['w'] is sharded across processes; this process cannot read it whole. "
            "Save sharded state with ember.checkpoint.OrbaxStore, where each process writes its own shards."
        )


def test_a_nan_on_one_process_stops_both_at_the_same_iteration(tmp_path):
    p0, p1 = _run(2, tmp_path, "nan")
    assert p0["iteration"] == p1["iteration"] == 2  # the NaN at iteration 1, read one step late


def test_time_limit_and_preemption_on_one_process_stop_both_at_the_same_iteration(tmp_path):
    """Process 1's clock runs out at 3 (or it alone gets SIGTERM during 5); checking every 2, both stop at 4 (6)."""
    p0, p1 = _run(2, tmp_path, "agree")
    assert p0["agreed"] == p1["agreed"] == {"time_limit": 4, "preemption": 6}
    assert sorted(p.name for p in (tmp_path / "preempted").iterdir()) == ["step_00000006"]
