"""TieredStore: every save into the fast tier, every k-th and the last into the durable one; restore across both."""

import re
import shutil
import warnings

import jax
import numpy as np
import optax
import pytest

from ember import Events
from ember.checkpoint import CheckpointStore, OrbaxStore, TieredStore
from ember.data import ArrayDataset
from ember.handlers import Checkpoint
from ember.training import TrainState, create_trainer
from tests.training.models import LinenNet, batches, classification_loss


def steps(store):
    return [c.step for c in store.checkpoints()]


def fast_of(fast, durable):
    """Where a TieredStore given ``fast`` keeps the fast checkpoints of the durable tier in ``durable``."""
    return fast / f"{durable.name}-{(durable / '.tier-id').read_text()}" / "process-0-of-1"


def filled(step):
    return {"w": np.full((2, 3), float(step), np.float32), "n": step}


def test_every_save_goes_fast_and_every_kth_durable(tmp_path):
    """Saves 1..7 with durable_every=3: the fast tier keeps its newest 2, the durable tier has saves 3 and 6."""
    store = TieredStore(tmp_path / "fast", tmp_path / "durable", durable_every=3)
    for step in range(1, 8):
        store.save(filled(step), step=step, metrics={"loss": 1.0 / step})
    assert steps(store.fast) == [6, 7]
    assert steps(store.durable) == [3, 6]
    assert [(c.step, c.path.parent.name) for c in store.checkpoints()] == [
        (3, "durable"),
        (6, "process-0-of-1"),
        (7, "process-0-of-1"),
    ]
    assert store.fast.root == fast_of(tmp_path / "fast", tmp_path / "durable")
    tree, info = store.restore(target=filled(0))
    assert (info.step, info.path.parent.name, tree["n"]) == (7, "process-0-of-1", 7)
    np.testing.assert_array_equal(tree["w"], np.full((2, 3), 7.0, np.float32))
    assert store.best("loss", mode="min").step == 7
    assert store.finish().path == tmp_path / "durable" / "step_00000007"  # the last save: into the durable tier
    assert steps(store.durable) == [3, 6, 7]
    assert store.finish() is None  # nothing left to copy


def test_background_saves_go_to_both_tiers_and_then_runs_after_both(tmp_path):
    """In the background, as a Checkpoint saves: both tiers are on disk when `then` runs."""
    store = TieredStore(tmp_path / "fast", tmp_path / "durable", durable_every=2)
    seen = []
    for step in (1, 2):
        store.save_in_background(
            filled(step), step=step, then=lambda s=step: seen.append((s, steps(store.fast), steps(store.durable)))
        )
    info = store.wait()
    assert info is not None
    assert info.path == tmp_path / "durable" / "step_00000002"
    assert seen == [(1, [1], []), (2, [1, 2], [2])]
    store.amend_in_background("step_00000002", metrics={"acc": 0.5})
    assert store.wait().metrics == {"acc": 0.5}
    assert store.fast.find("step_00000002").metrics == store.durable.find("step_00000002").metrics == {"acc": 0.5}


def test_a_wiped_fast_tier_restores_from_the_durable_one(tmp_path):
    store = TieredStore(tmp_path / "fast", tmp_path / "durable", durable_every=3)
    for step in range(1, 6):
        store.save(filled(step), step=step)
    shutil.rmtree(tmp_path / "fast")  # the node was replaced
    again = TieredStore(tmp_path / "fast", tmp_path / "durable", durable_every=3)
    tree, info = again.restore(target=filled(0))
    assert (info.step, info.path.parent.name, tree["n"]) == (3, "durable", 3)


def flip(data):
    raw = bytearray(data.read_bytes())
    raw[-3] ^= 0xFF
    data.write_bytes(bytes(raw))


def truncate(data):
    data.write_bytes(data.read_bytes()[:-10])


MOVED = ["corrupt-step_00000004", "step_00000002", "step_00000003"]  # set aside, never deleted
DAMAGE = {
    "altered": (flip, r"its state\.msgpack does not match the checksum in manifest\.json", MOVED),
    "truncated": (truncate, r"its state\.msgpack holds \d+ bytes, the manifest says \d+ \(truncated\)", MOVED),
    "deleted": (lambda data: data.unlink(), r"its state\.msgpack is missing", MOVED),
    "manifest deleted": (  # no manifest: not a checkpoint (a write that never finished), skipped and left
        lambda data: (data.parent / "manifest.json").unlink(),
        r"Skipping checkpoint 'step_00000004': it has no manifest",
        ["step_00000002", "step_00000003", "step_00000004"],
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_fast_checkpoint_is_skipped_and_the_same_step_read_from_the_durable_tier(tmp_path, damage):
    """The newest fast checkpoint altered, truncated, or a file of it deleted: the same step from the durable tier.

    A warning names it; a damaged one is moved aside (never deleted).
    """
    harm, warning, left = DAMAGE[damage]
    store = TieredStore(tmp_path / "fast", tmp_path / "durable", durable_every=2, keep_fast=3)
    for step in range(1, 5):
        store.save(filled(step), step=step)
    harm(store.fast.root / "step_00000004" / "state.msgpack")
    with pytest.warns(UserWarning, match=warning):
        tree, info = store.restore(target=filled(0))
    assert (info.step, info.path.parent.name, tree["n"]) == (4, "durable", 4)
    assert sorted(p.name for p in store.fast.root.iterdir()) == left


def test_retention_never_empties_the_durable_tier(tmp_path):
    """Deleting the durable tier's newest waits until it has a newer one; others go at once."""
    store = TieredStore(tmp_path / "fast", tmp_path / "durable", durable_every=2)
    for step in (1, 2):
        store.save(filled(step), step=step)
    store.delete("step_00000002")
    assert (steps(store.fast), steps(store.durable)) == ([1], [2])
    store.save(filled(3), step=3)
    store.save(filled(4), step=4)  # durable: now step 2 goes
    assert (steps(store.fast), steps(store.durable)) == ([3, 4], [4])


def test_a_save_replacing_a_durable_checkpoint_goes_durable(tmp_path):
    """The same step saved again with new arrays replaces its durable copy too, whatever the count."""
    store = TieredStore(tmp_path / "fast", tmp_path / "durable", durable_every=2)
    store.save(filled(1), step=1)
    store.save(filled(2), step=2)
    store.save(filled(20), step=2, replaces="step_00000002")  # the third save, not due, but it replaces one
    tree, _ = store.durable.restore()
    assert tree["n"] == 20


def test_after_a_save_forced_durable_by_what_it_replaces_the_interval_restarts(tmp_path):
    """durable_every=2: save 2 durable, save 2 again forced durable (it replaces a durable one), 3 fast, 4 durable."""
    store = TieredStore(tmp_path / "fast", tmp_path / "durable", durable_every=2)
    went = []
    for step, n, replaces in ((1, 1, None), (2, 2, None), (2, 20, "step_00000002"), (3, 3, None), (4, 4, None)):
        store.save(filled(n), step=step, replaces=replaces)
        went.append((step, store.last_save_durable, steps(store.durable)))
    assert went == [(1, False, []), (2, True, [2]), (2, True, [2]), (3, False, [2]), (4, True, [2, 4])]
    assert store.durable.restore()[0]["n"] == 4


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"^`durable_every` must be a positive int, got 0\.$"):
        TieredStore(tmp_path / "f", tmp_path / "d", durable_every=0)
    with pytest.raises(ValueError, match=r"^`keep_fast` must be a positive int, got True\.$"):
        TieredStore(tmp_path / "f", tmp_path / "d", keep_fast=True)
    with pytest.raises(TypeError, match=r"^`fast` must be a folder \(a str or a path\), got int\.$"):
        TieredStore(3, tmp_path / "d")  # type: ignore[arg-type]  # the error under test
    inner = TieredStore(tmp_path / "f", tmp_path / "d")
    with pytest.raises(TypeError, match=r"^`durable` must be a folder, a CheckpointStore or an OrbaxStore, got Tiered"):
        TieredStore(tmp_path / "g", inner)
    with pytest.raises(ValueError, match=r"^`fast` and `durable` must be separate folders, neither inside the other"):
        TieredStore(tmp_path / "d" / "fast", tmp_path / "d")


def test_a_fast_folder_that_cannot_hold_the_tier_is_refused_in_one_line(tmp_path):
    """A file, a path under a file, a folder that cannot be written, the durable folder or one around it: refused."""
    (tmp_path / "file").write_text("x")
    durable = tmp_path / "d"
    cases = [
        (tmp_path / "file", f"`fast` must be a folder, got {str(tmp_path / 'file')!r}, which is a file."),
        (
            tmp_path / "file" / "sub" / "deeper",
            f"`fast` must be a folder, got {str(tmp_path / 'file' / 'sub' / 'deeper')!r}, under "
            f"{str(tmp_path / 'file')!r}, which is a file.",
        ),
        ("/proc/ember-fast", "`fast` must be a folder this process can write, got '/proc/ember-fast' (No such file"),
        (durable, f"`fast` and `durable` must be separate folders, neither inside the other; got {str(durable)!r} and"),
        (tmp_path, f"`fast` and `durable` must be separate folders, neither inside the other; got {str(tmp_path)!r}"),
    ]
    for fast, said in cases:
        with pytest.raises(ValueError, match="^" + re.escape(said)) as refused:
            TieredStore(fast, durable)
        assert "\n" not in str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing made for a refused store


def test_relative_folders_are_fixed_when_the_store_is_made(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = TieredStore("fast", "durable", durable_every=1)
    monkeypatch.chdir("/")
    assert store.save(filled(1), step=1).path == tmp_path / "durable" / "step_00000001"
    assert store.fast.find("step_00000001").path == fast_of(tmp_path / "fast", tmp_path / "durable") / "step_00000001"


def test_a_full_fast_tier_fails_the_save_and_leaves_nothing_behind(tmp_path, monkeypatch):
    """ENOSPC in the fast tier: the save raises it, naming the checkpoint; no temporary folder is left."""
    store = TieredStore(tmp_path / "fast", tmp_path / "durable", durable_every=1)
    store.save(filled(1), step=1)
    import ember.checkpoint._msgpack as written

    def full(f, leaves):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(written, "write_leaves", full)
    with pytest.raises(
        OSError, match=r"No space left on device \(could not write checkpoint 'step_00000002' in .*fast"
    ):
        store.save(filled(2), step=2)
    assert sorted(p.name for p in store.fast.root.iterdir()) == ["step_00000001"]
    assert steps(store) == [1]


def test_an_orbax_durable_tier_gets_the_last_save_on_the_devices(tmp_path):
    durable = OrbaxStore(tmp_path / "durable")
    store = TieredStore(tmp_path / "fast", durable, durable_every=5)
    tree = {"w": jax.numpy.arange(6.0).reshape(2, 3)}
    store.save(tree, step=1)
    assert store.finish().step == 1
    restored, _ = durable.restore(target={"w": jax.numpy.zeros((2, 3))})
    np.testing.assert_array_equal(restored["w"], np.arange(6.0).reshape(2, 3))
    store.close()


def trainer_on(seed=0):
    state = TrainState.from_linen(LinenNet(), batches(1)[0]["x"][:2], optax.adam(1e-2), seed=seed, rngs=("dropout",))
    return create_trainer(state, classification_loss)


def digits_data():
    arrays = {k: np.concatenate([b[k] for b in batches(4)]) for k in ("x", "y")}
    return ArrayDataset(arrays, batch_size=16, shuffle=True, seed=1, drop_remainder=True)


def test_a_checkpoint_handler_saves_every_iteration_and_resumes_from_the_fast_tier(tmp_path):
    """n_saved=1, background writes, a save every iteration: the last save ends in both tiers; a new trainer resumes.

    It resumes from the fast tier, with the same train state, bit for bit.
    """
    trainer = trainer_on()
    store = TieredStore(tmp_path / "fast", tmp_path / "durable", durable_every=3)
    saver = Checkpoint({"trainer": trainer}, store, n_saved=1)
    saver.attach(trainer, Events.ITERATION_COMPLETED)
    trainer.run(digits_data(), max_epochs=2)  # 8 iterations: durable saves at 3 and 6, the last (8) at COMPLETED
    assert (steps(store.fast), steps(store.durable)) == ([8], [8])
    again = trainer_on(seed=5)
    info = Checkpoint({"trainer": again}, TieredStore(tmp_path / "fast", tmp_path / "durable")).resume()
    assert (info.step, info.path.parent.name, again.state.iteration) == (8, "process-0-of-1", 8)
    for a, b in zip(jax.tree.leaves(trainer.state.train_state), jax.tree.leaves(again.state.train_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert saver.last_checkpoint == fast_of(tmp_path / "fast", tmp_path / "durable") / "step_00000008"  # where it is
    third = trainer_on(seed=6)
    assert Checkpoint.load_objects({"trainer": third}, saver.last_checkpoint).step == 8  # Ignite's way to load it
    np.testing.assert_array_equal(
        np.asarray(third.state.train_state.params["Dense_0"]["kernel"]),
        np.asarray(trainer.state.train_state.params["Dense_0"]["kernel"]),
    )


def test_a_checkpoint_store_is_untouched_by_finish(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(filled(1), step=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert store.finish() is None
    assert steps(store) == [1]


def test_the_count_of_saves_goes_on_across_relaunches(tmp_path):
    """Two saves, a relaunch, one save: the third since the durable tier's newest goes durable (durable_every=3)."""
    store = TieredStore(tmp_path / "fast", tmp_path / "durable", durable_every=3)
    store.save(filled(1), step=1)
    store.save(filled(2), step=2)
    again = TieredStore(tmp_path / "fast", tmp_path / "durable", durable_every=3)
    again.save(filled(3), step=3)
    assert steps(again.durable) == [3]
    again.save(filled(4), step=4)
    assert TieredStore(tmp_path / "fast", tmp_path / "durable", durable_every=3)._count.since_durable == 1


def test_two_runs_given_one_fast_folder_never_read_each_others_checkpoints(tmp_path):
    """Runs A and B share a fast folder: each keeps its checkpoints in a folder there named by its durable tier."""
    fast = tmp_path / "shm"
    a = TieredStore(fast, tmp_path / "a", durable_every=10)
    for step in (1, 2):
        a.save({"w": np.full(2, float(step))}, step=step)
    a.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn of: B's folder is its own
        b = TieredStore(fast, tmp_path / "b", durable_every=10)
    assert b.latest() is None  # nothing of A's
    b.save({"w": np.full(2, 20.0)}, step=2)  # the same step's name as A's: no clash
    b.close()
    assert sorted(p.name for p in fast.iterdir()) == sorted(
        f"{d}-{(tmp_path / d / '.tier-id').read_text()}" for d in ("a", "b")
    )
    assert b.fast_root == fast_of(fast, tmp_path / "b").parent
    tree, info = TieredStore(fast, tmp_path / "b", durable_every=10).restore()  # B relaunched: finds its own
    assert (info.step, tree["w"].tolist()) == (2, [20.0, 20.0])
    tree, info = TieredStore(fast, tmp_path / "a", durable_every=10).restore()  # A relaunched: its own
    assert (info.step, tree["w"].tolist()) == (2, [2.0, 2.0])


def test_a_durable_folder_made_anew_does_not_resume_the_old_runs_fast_checkpoints(tmp_path):
    """The durable folder deleted, the same path given again: a new run, a new id, an empty fast folder of its own."""
    fast = tmp_path / "shm"
    old = TieredStore(fast, tmp_path / "a", durable_every=10)
    old.save({"w": np.ones(2)}, step=5)
    old.close()
    shutil.rmtree(tmp_path / "a")
    new = TieredStore(fast, tmp_path / "a", durable_every=10)
    assert (new.latest(), new.fast_root == old.fast_root) == (None, False)
    assert [c.step for c in old.fast.checkpoints()] == [5]  # the old run's, left where they were, not read
    new.close()


@pytest.mark.parametrize("text", ["", "3fa9", "not an id at all, and longer than forty characters", "\udcff\udcfe"])
def test_a_damaged_tier_id_is_made_anew_with_a_warning_and_the_old_fast_checkpoints_are_not_read(tmp_path, text):
    """Altered or truncated: whose fast checkpoints they were cannot be known; the durable tier (empty here) is read."""
    fast = tmp_path / "shm"
    a = TieredStore(fast, tmp_path / "a", durable_every=10)
    a.save({"w": np.ones(2)}, step=1)
    a.close()
    (tmp_path / "a" / ".tier-id").write_bytes(text.encode("ascii", "surrogateescape"))  # the last: bytes 0xff 0xfe
    shown = text.encode("ascii", "surrogateescape").decode("ascii", "replace")
    said = f"{tmp_path / 'a' / '.tier-id'} does not hold a durable tier's id ({shown[:40]!r}); a new one is made"
    with pytest.warns(RuntimeWarning, match="^" + re.escape(said)):
        b = TieredStore(fast, tmp_path / "a", durable_every=10)
    assert b.latest() is None
    assert re.fullmatch(r"[0-9a-f]{16}", (tmp_path / "a" / ".tier-id").read_text())
    b.close()


def test_a_deleted_tier_id_beside_checkpoints_is_made_anew_with_a_warning(tmp_path):
    """The durable tier holds checkpoints but no .tier-id: a new id, a warning; the durable checkpoints are read."""
    fast, durable = tmp_path / "shm", tmp_path / "a"
    a = TieredStore(fast, durable, durable_every=1)
    a.save({"w": np.ones(2)}, step=1)
    a.save({"w": np.ones(2)}, step=2)
    a.close()
    (durable / ".tier-id").unlink()
    said = f"{durable} holds checkpoints but no .tier-id (deleted, or written before tiers were named); a new one"
    with pytest.warns(RuntimeWarning, match="^" + re.escape(said)):
        b = TieredStore(fast, durable, durable_every=1)
    assert [(c.step, c.path.parent) for c in b.checkpoints()] == [(1, durable), (2, durable)]
    b.close()


def test_a_full_disk_when_the_tier_id_is_written_fails_the_store_and_a_later_one_makes_it(tmp_path, monkeypatch):
    """ENOSPC writing .tier-id: the store is refused with the OSError, no id left; once there is room, one is made."""
    import ember.checkpoint._fast_owner as owner

    def full(folder, name, text):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(owner, "replace_file", full)
        with pytest.raises(OSError, match=r"^\[Errno 28\] No space left on device$"):
            TieredStore(tmp_path / "fast", tmp_path / "durable")
    assert not (tmp_path / "durable" / ".tier-id").exists()
    store = TieredStore(tmp_path / "fast", tmp_path / "durable", durable_every=1)
    store.save(filled(1), step=1)
    assert store.fast.root == fast_of(tmp_path / "fast", tmp_path / "durable")
    store.close()
