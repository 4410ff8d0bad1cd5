"""Store behaviours at their edges, each pinned by a test that fails when the behaviour is broken on purpose.

Found by breaking the code one line at a time (a step damaged for the third time, a timed-out wait, re-saving the
durable tier's deleted newest): the code was right, and nothing said so.
"""

import re

import numpy as np
import pytest

from ember.checkpoint import CheckpointStore, OrbaxStore, TieredStore
from tests.slow_writes import slow_checkpoint_writes


def damage(info):
    """Cut the end off a checkpoint's data file."""
    data = next(p for p in info.path.iterdir() if p.name != "manifest.json" and p.is_file())
    data.write_bytes(data.read_bytes()[:-8])


def test_a_step_found_damaged_a_third_time_is_moved_aside_as_the_first_was(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save({"w": np.zeros(4)}, step=1)
    for attempt, aside in enumerate(["corrupt-step_00000002", "corrupt-step_00000002.2", "corrupt-step_00000002.3"]):
        info = store.save({"w": np.full(4, attempt + 1.0)}, step=2)
        damage(info)
        with pytest.warns(UserWarning, match=re.escape(f"It was moved aside to {aside!r} and skipped.")):
            trees, restored = store.restore()
        assert restored.step == 1
        np.testing.assert_array_equal(trees["w"], np.zeros(4))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["corrupt-step_00000002", "corrupt-step_00000002.2", "corrupt-step_00000002.3", "step_00000001"]


@pytest.fixture
def slow_writes(monkeypatch):
    """Every checkpoint write of the folder store takes 1 s more."""
    slow_checkpoint_writes(monkeypatch, 1.0)


@pytest.mark.parametrize("kind", ["store", "tiered"])
def test_a_wait_that_times_out_keeps_the_save_in_flight_and_says_so(tmp_path, slow_writes, kind):
    store = CheckpointStore(tmp_path) if kind == "store" else TieredStore(tmp_path / "fast", tmp_path / "durable")
    store.save_in_background({"w": np.arange(3.0)}, step=7)
    where = tmp_path if kind == "store" else tmp_path / "durable"
    with pytest.raises(TimeoutError, match=re.escape(f"The checkpoint being written into {where} was not done within")):
        store.wait(timeout=0.01)
    assert store.writing  # still in flight, not forgotten
    assert store.wait().step == 7  # a later wait waits for it
    assert not store.writing
    assert [c.step for c in store.checkpoints()] == [7]
    store.close()


def test_resaving_the_durable_tiers_deleted_newest_keeps_a_durable_checkpoint(tmp_path):
    """The durable tier's newest, deleted, stays until a newer one exists; saved again in its place, it is the new one.

    ``replaces=``: a handler changed the state at the same step (Checkpoint does this).
    """
    store = TieredStore(tmp_path / "fast", tmp_path / "durable", durable_every=2)
    for step in (1, 2, 3):
        store.save({"w": np.full(2, float(step))}, step=step)
    store.delete("step_00000002")
    assert [c.step for c in store.durable.checkpoints()] == [2]  # the durable tier's newest is kept
    store.save({"w": np.full(2, 20.0)}, step=2, replaces="step_00000002")
    assert [c.step for c in store.durable.checkpoints()] == [2]
    trees, info = store.durable.restore()
    assert info.step == 2
    np.testing.assert_array_equal(trees["w"], np.full(2, 20.0))  # the new one


def test_an_orbax_step_found_damaged_a_third_time_is_moved_aside_too(tmp_path):
    import jax.numpy as jnp

    store = OrbaxStore(tmp_path)
    store.save({"w": jnp.zeros(4)}, step=1)
    for attempt in range(3):
        info = store.save({"w": jnp.full(4, attempt + 1.0)}, step=2)
        manifest = info.path / "manifest.json"
        manifest.write_text(manifest.read_text()[:-20])  # a torn manifest
        with pytest.warns(UserWarning, match="It was moved aside to 'corrupt-step_00000002"):
            assert store.restore()[1].step == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("corrupt-")) == [
        "corrupt-step_00000002",
        "corrupt-step_00000002.2",
        "corrupt-step_00000002.3",
    ]
    store.close()


def test_a_listing_skips_a_file_or_a_folder_that_vanishes_while_it_looks(tmp_path, monkeypatch):
    """A manifest being replaced (an amend on a writer thread) and a checkpoint deleted meanwhile break no listing.

    The vanishing is made certain: a dangling link stands for a temporary manifest already renamed, and a listed
    folder that is not there for one deleted after the folder was listed.
    """
    store = CheckpointStore(tmp_path)
    store.save({"w": np.zeros(1)}, step=1)
    store.save({"w": np.zeros(1)}, step=2)
    (tmp_path / "step_00000001" / ".tmp-manifest.json-host.1-ab").symlink_to(tmp_path / "gone")
    (tmp_path / "step_00000002" / "notes.txt").symlink_to(tmp_path / "gone")
    listed = CheckpointStore._candidates
    monkeypatch.setattr(CheckpointStore, "_candidates", lambda self: [*listed(self), tmp_path / "step_00000003"])
    assert [c.step for c in store.checkpoints()] == [1, 2]
