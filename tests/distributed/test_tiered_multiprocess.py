"""A TieredStore on 2 processes with FSDP: each process's fast tier holds its own shards.

A step is restored from the fast tier only when every process has it, otherwise from the durable tier, by both.
"""

import shutil
from pathlib import Path

from tests.distributed.launch import launch

SCRIPT = Path(__file__).with_name("tiered_script.py")


def test_both_resume_from_the_fast_tier_and_with_one_wiped_both_from_the_durable_one(tmp_path):
    trained = launch(SCRIPT, 2, tmp_path, "train")
    assert trained[0]["digests"]["7"] != trained[1]["digests"]["7"]  # FSDP: each process holds other shards
    fast = tmp_path / "fast" / f"durable-{(tmp_path / 'durable' / '.tier-id').read_text()}"  # the durable tier's
    for p in (0, 1):  # every process wrote its own folder of the fast tier
        assert sorted(x.name for x in (fast / f"process-{p}-of-2").iterdir())[-1] == "step_00000007"
    assert sorted(x.name for x in (tmp_path / "durable").iterdir()) == [".tier-id", "step_00000006"]  # 3, 6; n_saved=1

    both = launch(SCRIPT, 2, tmp_path, "resume")
    for p, result in enumerate(both):
        assert (result["step"], result["tier"]) == (7, "fast")
        assert result["digest"] == trained[p]["digests"]["7"]  # bit for bit, each process its own shards

    shutil.rmtree(fast / "process-1-of-2")  # one node's local storage is gone
    both = launch(SCRIPT, 2, tmp_path, "resume")
    for p, result in enumerate(both):
        assert (result["step"], result["tier"]) == (6, "durable")  # not 7: process 1 has it no more
        assert result["digest"] == trained[p]["digests"]["6"]
