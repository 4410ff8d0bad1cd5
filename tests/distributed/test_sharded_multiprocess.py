"""Sharded training on jax.distributed: FSDP over 2 processes x 2 CPU devices against 1 process x 4 devices."""

from pathlib import Path

import numpy as np
import pytest

from tests.distributed.launch import launch
from tests.writers.tb_reader import read_events

SCRIPT = Path(__file__).with_name("sharded_script.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    one, two = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    return {"one": launch(SCRIPT, 1, one), "two": launch(SCRIPT, 2, two), "two_dir": two}


def test_fsdp_over_two_processes_equals_one_process_of_four_devices(runs):
    (ref,), (p0, p1) = runs["one"], runs["two"]
    assert p0["params"] == p1["params"]  # one global computation: identical on both processes
    for a, b in zip(ref["params"], p0["params"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert p0["metrics"] == p1["metrics"]
    assert p0["metrics"] == pytest.approx(ref["metrics"], rel=1e-5)


def test_each_process_holds_only_its_shards(runs):
    """FSDP over 4 devices on 2 processes: each holds about half of the parameters' bytes (small ones replicated)."""
    (ref,), (p0, p1) = runs["one"], runs["two"]
    assert p0["kernel_spec"] == p1["kernel_spec"] == ref["kernel_spec"] == "P('fsdp',)"
    for p in (p0, p1):
        assert 0.5 <= p["held_fraction"] < 0.55, p["held_fraction"]
    assert ref["held_fraction"] > 1.0  # one process holds every shard (and every replica)


def test_a_checkpoint_written_by_both_processes_is_restored_by_both(runs):
    (ref,), (p0, p1) = runs["one"], runs["two"]
    for p in (p0, p1, ref):
        assert p["restored_step"] == 12
        assert p["restored_equal"] is True
        assert p["checkpoints"] == ["step_00000008", "step_00000012"]  # n_saved=2, one set of folders


def test_histograms_of_state_sharded_across_processes_are_counted_on_device(runs):
    """Weight and gradient histograms of FSDP state over 2 processes: process 0 writes tensorboardX's exact counts."""
    _, (p0, _) = runs["one"], runs["two"]
    events = read_events(runs["two_dir"] / "tb")
    steps = sorted({e.step for e in events for v in e.summary.value if v.tag == "weights/Dense_1.kernel"})
    assert steps == [p0["final_step"] // 3, 2 * p0["final_step"] // 3, p0["final_step"]]
    assert {v.tag for e in events for v in e.summary.value if v.tag.startswith("grads/")} >= {"grads/Dense_1.kernel"}
    (last,) = [
        v.histo for e in events for v in e.summary.value if v.tag == "weights/Dense_1.kernel" and e.step == steps[-1]
    ]
    limits, counts = p0["kernel_histogram"]
    assert list(last.bucket) == counts
    assert list(last.bucket_limit) == pytest.approx(limits)


def test_a_users_save_handler_is_called_on_process_0_alone_with_the_whole_arrays(runs):
    """Ignite's save_on_rank=0: each sharded array gathered from both processes, then handed to process 0's saver."""
    p0, p1 = runs["two"]
    assert p0["user_saves"] == ["trainer_12.ckpt"]
    assert p1["user_saves"] == []
    assert p0["user_saved_kernel_whole"] is True
