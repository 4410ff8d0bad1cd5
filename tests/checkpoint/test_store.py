import json
import os
import stat
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ember import __version__
from ember.checkpoint import CheckpointStore
from ember.training import TrainState, make_train_step
from tests.training.models import LinenNet, batches, classification_loss


def linen_state(seed=0):
    return TrainState.from_linen(LinenNet(), jnp.ones((2, 4)), optax.adam(1e-2), seed=seed, rngs=("dropout",))


def trained(steps=3):
    state, step = linen_state(), jax.jit(make_train_step(classification_loss))
    for b in batches(steps):
        state, _ = step(state, b)
    return state


def test_a_train_state_round_trips_bit_for_bit_and_keeps_training(tmp_path):
    """A trained TrainState restores into a fresh one exactly, and training on from both agrees."""
    store = CheckpointStore(tmp_path)
    state = trained()
    store.save(state, step=int(state.step), metadata={"engine": {"iteration": 3, "epoch_length": None}})
    restored, info = store.restore(target=linen_state(seed=1))
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert info.manifest["metadata"] == {"engine": {"iteration": 3, "epoch_length": None}}
    step = jax.jit(make_train_step(classification_loss))
    next_a, _ = step(state, batches(4)[3])
    next_b, _ = step(restored, batches(4)[3])
    np.testing.assert_array_equal(next_a.params["Dense_0"]["kernel"], next_b.params["Dense_0"]["kernel"])


def test_the_manifest_describes_the_checkpoint(tmp_path):
    """The manifest holds step, metrics, wall time, version, every leaf's shape and dtype, and the checksum."""
    store = CheckpointStore(tmp_path)
    info = store.save({"w": np.ones((2, 3), np.float32), "n": 4, "flag": None}, step=12, metrics={"loss": 0.25})
    manifest = json.loads((info.path / "manifest.json").read_text())
    assert manifest["step"] == 12
    assert manifest["metrics"] == {"loss": 0.25}
    assert manifest["ember_version"] == __version__
    assert manifest["tree"] == {
        "w": {"shape": [2, 3], "dtype": "float32"},
        "n": {"value": "int"},
        "flag": {"value": "NoneType"},
    }
    assert manifest["files"]["state.msgpack"]["bytes"] == (info.path / "state.msgpack").stat().st_size
    data = (info.path / "state.msgpack").read_bytes()
    assert manifest["files"]["state.msgpack"]["crc32"] == f"{zlib.crc32(data):08x}"
    tree, _ = store.restore()
    assert (tree["n"], tree["flag"], tree["w"].tolist()) == (4, None, [[1.0] * 3] * 2)


def test_a_leftover_temporary_from_a_crash_is_removed(tmp_path):
    """An interrupted write leaves a temporary folder, never a checkpoint; opening the store removes it."""
    (tmp_path / ".tmp-step_00000009-deadbeef").mkdir()
    (tmp_path / ".tmp-step_00000009-deadbeef" / "state.msgpack").write_bytes(b"half")
    store = CheckpointStore(tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert store.latest() is None


def test_incomplete_and_corrupt_checkpoints_are_skipped_with_a_warning(tmp_path):
    """Missing manifest, truncated data and a flipped byte are each skipped, named, with the reason."""
    store = CheckpointStore(tmp_path)
    good = store.save({"w": np.arange(4.0)}, step=1)
    no_manifest = store.save({"w": np.arange(4.0) + 1}, step=2)
    (no_manifest.path / "manifest.json").unlink()
    truncated = store.save({"w": np.arange(4.0) + 2}, step=3)
    data = truncated.path / "state.msgpack"
    data.write_bytes(data.read_bytes()[:-5])
    flipped = store.save({"w": np.arange(4.0) + 3}, step=4)
    raw = bytearray((flipped.path / "state.msgpack").read_bytes())
    raw[-1] ^= 0xFF
    (flipped.path / "state.msgpack").write_bytes(bytes(raw))

    with pytest.warns(UserWarning, match="step_0000000") as caught:
        tree, info = store.restore()
    messages = [str(w.message) for w in caught]
    assert info.path == good.path
    assert tree["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert messages == [
        "Skipping checkpoint 'step_00000002': it has no manifest (it is not a checkpoint, or its write did not "
        "finish).",
        f"Checkpoint '{tmp_path / 'step_00000003'}' is corrupt: its state.msgpack holds 64 bytes, the manifest says "
        "69 (truncated). It was moved aside to 'corrupt-step_00000003' and skipped.",
        f"Checkpoint '{tmp_path / 'step_00000004'}' is corrupt: its state.msgpack does not match the checksum in "
        "manifest.json. It was moved aside to 'corrupt-step_00000004' and skipped.",
    ]
    # damaged checkpoints are renamed, never deleted; the folder without a manifest is not ours to move
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "corrupt-step_00000003",
        "corrupt-step_00000004",
        "step_00000001",
        "step_00000002",
    ]
    assert [c.step for c in store.checkpoints()] == [1]


def test_files_get_the_permissions_the_umask_allows(tmp_path):
    """Checkpoint files and folders follow the umask (no 0600 temporaries, Ignite #1876)."""
    for umask, file_mode, dir_mode in ((0o022, 0o644, 0o755), (0o077, 0o600, 0o700)):
        old = os.umask(umask)
        try:
            info = CheckpointStore(tmp_path / f"u{umask:o}").save({"w": np.ones(1)}, step=1)
        finally:
            os.umask(old)
        assert stat.S_IMODE((info.path / "state.msgpack").stat().st_mode) == file_mode
        assert stat.S_IMODE((info.path / "manifest.json").stat().st_mode) == file_mode
        assert stat.S_IMODE(info.path.stat().st_mode) == dir_mode


def test_restoring_into_a_different_structure_lists_the_differences(tmp_path):
    """A target of another shape, dtype or structure is refused, naming each mismatching path."""
    store = CheckpointStore(tmp_path)
    store.save({"a": np.ones((2, 3), np.float32), "b": np.ones(2, np.int32), "c": np.ones(1)}, step=1)
    target = {"a": np.ones((3, 3), np.float32), "b": np.ones(2, np.float32), "d": np.ones(1)}
    with pytest.raises(
        ValueError,
        match=r"(?s)does not fit the target \(4 differences\).*missing from the checkpoint: d.*"
        r"not in the target: c.*a: the checkpoint has float32\[2, 3\], the target float32\[3, 3\].*"
        r"b: the checkpoint has int32\[2\], the target float32\[2\]",
    ):
        store.restore(target=target)


def test_latest_best_checkpoints_and_delete(tmp_path):
    """Checkpoints are ordered by step; best ranks by a metric in either mode; delete removes one."""
    store = CheckpointStore(tmp_path)
    for step, loss in ((10, 0.5), (20, 0.3), (30, 0.4)):
        store.save({"w": np.full(1, step)}, step=step, metrics={"loss": loss})
    assert store.latest().step == 30
    assert store.best("loss", mode="min").step == 20
    assert store.best("loss", mode="max").step == 10
    assert store.best("accuracy") is None
    store.delete(store.latest())
    assert [c.step for c in store.checkpoints()] == [10, 20]
    assert store.restore()[0]["w"].tolist() == [20]


def test_save_arguments_and_an_empty_store(tmp_path):
    """Bad steps, names and modes are refused; an empty store has nothing to restore."""
    store = CheckpointStore(tmp_path)
    with pytest.raises(ValueError, match=r"`step` must be a non-negative int, got -1"):
        store.save({"w": np.ones(1)}, step=-1)
    with pytest.raises(ValueError, match=r"`name` must be a plain folder name, got '../x'"):
        store.save({"w": np.ones(1)}, step=1, name="../x")
    with pytest.raises(ValueError, match=r"`mode` must be 'min' or 'max', got 'low'"):
        store.best("loss", mode="low")  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match=r"No valid checkpoint in"):
        store.restore()
    store.save({"w": np.ones(1)}, step=1)
    with pytest.raises(FileExistsError, match=r"A checkpoint named 'step_00000001' already exists"):
        store.save({"w": np.ones(1)}, step=1)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000001"]
    with pytest.raises(
        TypeError, match=r"Checkpoint leaf 'f' is a builtin_function_or_method; leaves must be arrays or scalars"
    ):
        store.save({"f": print}, step=2)


def test_large_leaves_are_written_and_read_in_pieces(tmp_path, monkeypatch):
    """Arrays larger than the I/O piece (shrunk here) round-trip exactly; the checksum covers every piece."""
    import ember.checkpoint._format as fmt

    monkeypatch.setattr(fmt, "CHUNK", 1 << 20)
    store = CheckpointStore(tmp_path)
    w = np.random.default_rng(0).normal(size=(3, 1 << 19)).astype(np.float32)  # 6 MiB: 6 pieces
    info = store.save({"w": w, "b": np.arange(3, dtype=np.int8)}, step=1)
    tree, _ = store.restore(target={"w": np.zeros_like(w), "b": np.zeros(3, np.int8)})
    np.testing.assert_array_equal(tree["w"], w)
    assert tree["b"].tolist() == [0, 1, 2]
    data = (info.path / "state.msgpack").read_bytes()
    assert info.manifest["files"]["state.msgpack"]["crc32"] == f"{zlib.crc32(data):08x}"


def test_pruning_verifies_each_checkpoint_once_and_again_when_a_file_of_it_is_rewritten(tmp_path, monkeypatch):
    """Retention after every save reads each manifest once; a checkpoint damaged on disk since is noticed."""
    import ember.checkpoint._folder as folder_module

    read = []
    real = folder_module.read_manifest
    monkeypatch.setattr(folder_module, "read_manifest", lambda path: (read.append(path.name), real(path))[1])
    store = CheckpointStore(tmp_path)
    for step in (1, 2, 3):
        store.save({"w": np.full(2, step)}, step=step)
        store.prune(keep_latest=2)
    assert read == ["step_00000001", "step_00000002", "step_00000003"]
    manifest = tmp_path / "step_00000003" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"step": 3', '"step": 30'))  # fails its checksum
    assert [c.step for c in store.checkpoints()] == [2]  # re-read, found damaged, left out (and so not counted)
    assert read[3:] == ["step_00000003"]


def test_a_store_made_on_a_folder_leaves_a_write_in_flight_alone(tmp_path, monkeypatch):
    """A second store on the folder (a reader, another process's store) while a background save runs: it commits."""
    import threading

    import ember.checkpoint._msgpack as store_module

    entered, release = threading.Event(), threading.Event()
    real = store_module.write_leaves

    def held(f, leaves):
        entered.set()
        assert release.wait(timeout=30)
        return real(f, leaves)

    monkeypatch.setattr(store_module, "write_leaves", held)
    writer = CheckpointStore(tmp_path)
    writer.save_in_background({"w": np.arange(3.0)}, step=1)
    assert entered.wait(timeout=30)  # the writer thread has made its folder and is writing the data file into it
    in_flight = [p.name for p in tmp_path.iterdir()]
    assert len(in_flight) == 1
    assert in_flight[0].startswith(".tmp-step_00000001-")
    CheckpointStore(tmp_path)  # would have deleted the write's folder
    assert [p.name for p in tmp_path.iterdir()] == in_flight
    release.set()
    assert writer.wait().step == 1
    assert [c.step for c in CheckpointStore(tmp_path).checkpoints()] == [1]


def test_only_abandoned_temporaries_are_removed(tmp_path):
    """A dead process's, an unowned (older ember) one, and a day-old one of another host go; a live writer's stays."""
    import os
    import subprocess
    import sys

    from ember._atomic_file import STALE_AFTER, owner, temporary_name

    host = owner().split(".")[0]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone_pid = int(dead.stdout)
    names = {
        "dead": temporary_name("step_00000001", f"{host}.{gone_pid}"),
        "live": temporary_name("step_00000002"),  # this process: alive
        "unowned": ".tmp-step_00000003-1a2b3c4d",
        "elsewhere_old": temporary_name("step_00000004", "otherhost.12"),
        "elsewhere_new": temporary_name("step_00000005", "otherhost.13"),
    }
    for name in names.values():
        (tmp_path / name).mkdir()
    old = (tmp_path / names["elsewhere_old"]).stat().st_mtime - STALE_AFTER - 60
    os.utime(tmp_path / names["elsewhere_old"], (old, old))
    CheckpointStore(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([names["live"], names["elsewhere_new"]])


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
@pytest.mark.parametrize("layout", ["transposed", "strided", "reversed", "fortran"])
def test_arrays_that_are_not_c_contiguous_save_and_restore_exactly(tmp_path, background, layout):
    """A transposed, strided, reversed or Fortran-ordered NumPy array: written in C order, read back equal."""
    base = np.arange(24.0).reshape(4, 6)
    array = {"transposed": base.T, "strided": base[:, ::2], "reversed": base[::-1], "fortran": np.asfortranarray(base)}[
        layout
    ]
    assert not array.flags.c_contiguous or layout == "fortran"
    store = CheckpointStore(tmp_path)
    if background:
        store.save_in_background({"w": array}, step=1)
        store.wait()
    else:
        store.save({"w": array}, step=1)
    tree, _ = store.restore()
    np.testing.assert_array_equal(tree["w"], array)
    assert tree["w"].shape == array.shape


@pytest.mark.parametrize("mode", ["max", "min"])
def test_ties_in_best_checkpoints_go_to_the_later_step(tmp_path, mode):
    """Two checkpoints share the best score: best() and ranked() prefer the later step; retention keeps it."""
    store = CheckpointStore(tmp_path)
    good, bad = (0.9, 0.5) if mode == "max" else (0.1, 0.5)
    for step, score in ((1, good), (2, bad), (3, good), (4, bad)):
        store.save({"w": np.zeros(1)}, step=step, metrics={"score": score})
    assert store.best("score", mode=mode).step == 3
    assert [c.step for c in store.ranked("score", mode)] == [3, 1, 4, 2]
    store.prune(keep_best=1, metric="score", mode=mode)
    assert [c.step for c in store.checkpoints()] == [3]


def test_every_single_byte_flip_in_a_data_file_is_found_by_its_checksum(tmp_path):
    """Each byte of a small checkpoint's data file flipped in turn: every one is caught (never a wrong restore)."""
    from ember.checkpoint import CorruptCheckpointError

    store = CheckpointStore(tmp_path)
    info = store.save({"w": np.arange(6, dtype=np.float32), "n": 3}, step=1)
    data = info.path / "state.msgpack"
    clean = data.read_bytes()
    for i in range(len(clean)):
        damaged = bytearray(clean)
        damaged[i] ^= 0x20
        data.write_bytes(bytes(damaged))
        with pytest.raises(CorruptCheckpointError, match=r"state\.msgpack does not match the checksum"):
            store.restore(checkpoint=info)
    data.write_bytes(clean)
    assert store.restore(checkpoint=info)[0]["w"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_bfloat16_and_float8_arrays_round_trip(tmp_path):
    """Arrays of ml_dtypes' types (a bf16-true train state, float8) save and restore with their dtype and values."""
    import ml_dtypes

    tree = {
        "h": np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16),
        "f8": np.full(4, 0.5, ml_dtypes.float8_e4m3fn),
        "scalar": jnp.asarray(1.5, jnp.bfloat16),
    }
    store = CheckpointStore(tmp_path)
    store.save_in_background(tree, step=1)
    store.wait()
    restored, info = store.restore(target=tree)
    assert info.manifest["tree"]["h"] == {"shape": [2, 3], "dtype": "bfloat16"}
    for key, value in tree.items():
        assert restored[key].dtype == np.asarray(value).dtype, key
        np.testing.assert_array_equal(np.asarray(restored[key], np.float32), np.asarray(value, np.float32))


def test_a_checkpoint_another_process_removes_first_is_gone_without_an_error(tmp_path, monkeypatch):
    """Two removers at once (watchers ending together): the one whose rename finds the folder gone returns quietly."""
    from ember.checkpoint import _atomic

    store = CheckpointStore(tmp_path)
    info = store.save({"w": np.zeros(1)}, step=1)
    replace = os.replace

    def other_first(source, target):  # the other remover renames it between this one's look and its rename
        replace(source, tmp_path / ".tmp-deleting-by-the-other")
        replace(source, target)

    monkeypatch.setattr(_atomic.os, "replace", other_first)
    store.delete(info)
    assert store.checkpoints() == []
