import re
import shutil

import jax
import numpy as np
import pytest

from ember import Events
from ember.checkpoint import OrbaxStore
from ember.handlers import Checkpoint
from tests.handlers.test_checkpoint import new_trainer


@pytest.fixture
def store(tmp_path):
    s = OrbaxStore(tmp_path)
    yield s
    s.close()


def test_a_run_saved_through_orbax_resumes_bit_for_bit(store):
    """The Checkpoint handler over an OrbaxStore: stop mid-epoch, restore into a new trainer, finish."""
    straight, data = new_trainer()
    straight.run(data, max_epochs=3)

    first, data = new_trainer()
    saver = Checkpoint({"trainer": first}, store, n_saved=2)
    saver.attach(first, Events.ITERATION_COMPLETED(every=2))
    first.add_event_handler(Events.ITERATION_COMPLETED(once=6), lambda e: e.terminate())
    first.run(data, max_epochs=3)
    assert [c.step for c in store.checkpoints()] == [4, 6]
    assert sorted(p.name for p in store.checkpoints()[-1].path.iterdir()) == ["manifest.json", "state"]

    second, fresh_data = new_trainer()
    assert Checkpoint({"trainer": second}, store).resume().step == 6
    second.run(fresh_data)
    for a, b in zip(
        jax.tree.leaves(second.state.train_state), jax.tree.leaves(straight.state.train_state), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_an_unfinished_orbax_item_is_moved_aside_with_a_warning(store):
    """A checkpoint whose orbax item is gone is renamed corrupt-<name> (kept), named in the warning, and skipped."""
    for step in (1, 2):
        store.save({"w": np.full(3, float(step), np.float32)}, step=step)
    shutil.rmtree(store.root / "step_00000002" / "state")
    with pytest.warns(
        UserWarning,
        match=re.escape(
            f"Checkpoint '{store.root / 'step_00000002'}' is corrupt: its state folder is missing. It was moved "
            "aside to 'corrupt-step_00000002' and skipped."
        ),
    ):
        info = store.latest()
    assert info.step == 1
    assert (store.root / "corrupt-step_00000002" / "manifest.json").exists()
    tree, _ = store.restore(target={"w": np.zeros(3, np.float32)}, checkpoint=info)
    assert np.asarray(tree["w"]).tolist() == [1.0, 1.0, 1.0]


def test_a_structure_mismatch_lists_the_differences(store):
    store.save({"w": np.zeros(3, np.float32)}, step=1)
    with pytest.raises(ValueError, match=re.escape("w: the checkpoint has float32[3], the target float32[4]")):
        store.restore(target={"w": np.zeros(4, np.float32)})


def test_background_saves_and_retention(store):
    for step in range(1, 5):
        store.save_in_background({"w": np.full(2, float(step), np.float32)}, step=step, metrics={"loss": 1.0 / step})
    assert store.wait().step == 4
    store.prune(keep_latest=1, keep_best=1, metric="loss", mode="max")
    assert [c.step for c in store.checkpoints()] == [1, 4]
    assert not [p for p in store.root.iterdir() if p.name.startswith(".tmp-")]
