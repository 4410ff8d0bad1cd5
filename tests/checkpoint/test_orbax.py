import json
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ember import Events
from ember.checkpoint import CheckpointStore, OrbaxStore
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


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    """A folder holding steps 1 and 2 of {"w": arange(100_000) * step}, copied afresh by each test that damages it."""
    folder = tmp_path_factory.mktemp("orbax-template")
    store = OrbaxStore(folder)
    for step in (1, 2):
        store.save({"w": jnp.arange(100_000.0) * step}, step=step)
    store.close()
    return folder


def orbax_files(checkpoint):
    return sorted(str(p.relative_to(checkpoint)) for p in (checkpoint / "state").rglob("*") if p.is_file())


def flip_a_byte(path):
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


DAMAGE = {
    "altered": (flip_a_byte, "does not match its CRC-32 in the manifest (it was changed or damaged on disk)"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:-1]), "holds "),
    "deleted": (lambda p: p.unlink(), "is missing"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_every_damaged_file_of_an_orbax_checkpoint_is_caught_and_the_previous_one_restored(
    two_checkpoints, tmp_path, damage
):
    """Each file orbax wrote, damaged in turn: the checkpoint is moved aside naming that file, and step 1 restored."""
    harm, why = DAMAGE[damage]
    names = orbax_files(two_checkpoints / "step_00000002")
    assert len(names) >= 8
    assert "state/_METADATA" in names
    for i, name in enumerate(names):
        folder = tmp_path / str(i)
        shutil.copytree(two_checkpoints, folder)
        harm(folder / "step_00000002" / name)
        store = OrbaxStore(folder)
        with pytest.warns(UserWarning, match="moved aside") as caught:
            tree, info = store.restore(target={"w": jnp.zeros(100_000)})
        store.close()
        message = str(caught[0].message)
        assert message.startswith(f"Checkpoint '{folder / 'step_00000002'}' is corrupt: its {name} {why}"), message
        assert message.endswith("It was moved aside to 'corrupt-step_00000002' and skipped.")
        assert info.step == 1
        np.testing.assert_array_equal(np.asarray(tree["w"]), np.arange(100_000.0))
        assert sorted(p.name for p in folder.iterdir()) == ["corrupt-step_00000002", "step_00000001"]


def test_the_manifest_records_every_file_with_its_size_and_crc32(two_checkpoints):
    """What the store wrote is what the manifest lists: every file of the orbax item, with its size."""
    checkpoint = two_checkpoints / "step_00000002"
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    recorded = {k: v for k, v in manifest["files"].items() if k != "state"}
    assert sorted(recorded) == orbax_files(checkpoint)
    for name, entry in recorded.items():
        assert entry["bytes"] == (checkpoint / name).stat().st_size
        assert re.fullmatch("[0-9a-f]{8}", entry["crc32"])
    assert manifest["files"]["state"] == {"format": "orbax"}


def test_ember_inspect_checks_every_byte_of_an_orbax_checkpoint(two_checkpoints, tmp_path, capsys):
    """`ember inspect` on an altered file exits 2 naming it; on a sound checkpoint it reports the verified size."""
    from ember.cli import main

    folder = tmp_path / "copy"
    shutil.copytree(two_checkpoints, folder)
    assert main(["inspect", str(folder / "step_00000001")]) == 0
    assert "verified" in capsys.readouterr().out
    biggest = max((folder / "step_00000002" / "state").rglob("*"), key=lambda p: p.stat().st_size if p.is_file() else 0)
    flip_a_byte(biggest)
    assert main(["inspect", str(folder / "step_00000002")]) == 2
    name = biggest.relative_to(folder / "step_00000002")
    assert f"its {name} does not match its CRC-32 in the manifest" in capsys.readouterr().err


def test_an_error_that_is_not_damage_moves_nothing_aside(two_checkpoints, tmp_path, monkeypatch):
    """Orbax failing on intact files is raised as it is; the checkpoint stays, and the next restore reads it."""
    folder = tmp_path / "copy"
    shutil.copytree(two_checkpoints, folder)
    store = OrbaxStore(folder)

    def broken(*args, **kwargs):
        raise ValueError("an orbax bug")

    monkeypatch.setattr(store.format._checkpointer, "restore", broken)
    with pytest.raises(
        RuntimeError,
        match=re.escape("although every file of it matches its size and CRC-32 (ValueError: an orbax bug)"),
    ):
        store.restore(target={"w": jnp.zeros(100_000)})
    assert sorted(p.name for p in folder.iterdir()) == ["step_00000001", "step_00000002"]
    monkeypatch.undo()
    assert store.restore(target={"w": jnp.zeros(100_000)})[1].step == 2
    store.close()


@pytest.mark.parametrize("kind", [OrbaxStore, CheckpointStore], ids=["orbax", "msgpack"])
def test_a_relative_folder_saves_and_resumes_from_anywhere(tmp_path, monkeypatch, kind):
    """OrbaxStore("runs/big/ckpt"), as the docs write it: background saves, then a resume after a chdir."""
    monkeypatch.chdir(tmp_path)
    first, data = new_trainer()
    store = kind("runs/big/ckpt")
    assert store.root == tmp_path / "runs" / "big" / "ckpt"
    saver = Checkpoint({"trainer": first}, store, n_saved=2)
    saver.attach(first, Events.ITERATION_COMPLETED(every=2))
    first.add_event_handler(Events.ITERATION_COMPLETED(once=6), lambda e: e.terminate())
    first.run(data, max_epochs=3)
    getattr(store, "close", lambda: None)()

    second, _ = new_trainer()
    again = kind("runs/big/ckpt")
    monkeypatch.chdir(tmp_path / "runs")  # a later chdir changes nothing
    assert Checkpoint({"trainer": second}, again).resume().step == 6
    assert sorted(p.name for p in (tmp_path / "runs" / "big" / "ckpt").iterdir()) == ["step_00000004", "step_00000006"]
    for a, b in zip(jax.tree.leaves(second.state.train_state), jax.tree.leaves(first.state.train_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    getattr(again, "close", lambda: None)()


def test_restoring_without_a_target_gives_the_arrays_as_saved(store):
    """No target: a nested dict of the saved arrays, values and dtypes as written."""
    store.save({"w": np.arange(4, dtype=np.float32), "n": {"k": np.int32(3)}}, step=1)
    tree, info = store.restore()
    assert info.step == 1
    np.testing.assert_array_equal(np.asarray(tree["w"]), np.arange(4, dtype=np.float32))
    assert int(tree["n"]["k"]) == 3
