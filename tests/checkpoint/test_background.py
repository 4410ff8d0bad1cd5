import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ember.checkpoint._msgpack as store_module
from ember.checkpoint import CheckpointStore


def test_background_save_copies_to_host_before_returning(tmp_path):
    """What is saved is fixed when save_in_background returns; later changes do not leak in."""
    store = CheckpointStore(tmp_path)
    host = np.arange(4.0)
    device = jnp.arange(4.0)
    store.save_in_background({"host": host, "device": device}, step=1)
    host[:] = -1.0
    info = store.wait()
    tree, _ = store.restore(checkpoint=info)
    assert tree["host"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert tree["device"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_the_write_runs_on_another_thread_and_the_next_save_waits(tmp_path, monkeypatch):
    """The caller returns while the write is in flight; a second save starts only after the first is on disk."""
    release, order = threading.Event(), []
    write = store_module.write_leaves

    def slow(f, leaves):
        order.append(("start", threading.current_thread().name))
        release.wait(5)
        out = write(f, leaves)
        order.append(("done", threading.current_thread().name))
        return out

    monkeypatch.setattr(store_module, "write_leaves", slow)
    store = CheckpointStore(tmp_path)
    first = store.save_in_background({"w": np.ones(1)}, step=1)
    time.sleep(0.05)
    assert not first.done()
    assert store.checkpoints() == []
    threading.Timer(0.05, release.set).start()
    store.save_in_background({"w": np.ones(1)}, step=2)  # waits for the first
    assert first.done()
    store.wait()
    assert [c.step for c in store.checkpoints()] == [1, 2]
    assert [kind for kind, _ in order] == ["start", "done", "start", "done"]
    assert all(name.startswith("ember-checkpoint") for _, name in order)


def test_a_failed_background_write_is_raised_and_leaves_earlier_checkpoints_intact(tmp_path, monkeypatch):
    """A disk error in the background surfaces at raise_if_failed/wait; nothing half-written remains."""
    store = CheckpointStore(tmp_path)
    store.save({"w": np.ones(1)}, step=1)

    def disk_full(f, leaves):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_module, "write_leaves", disk_full)
    future = store.save_in_background({"w": np.ones(1)}, step=2)
    while not future.done():
        time.sleep(0.01)
    with pytest.raises(OSError, match="No space left on device"):
        store.raise_if_failed()
    store.raise_if_failed()  # reported once
    assert [c.step for c in store.checkpoints()] == [1]
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000001"]
    store.save_in_background({"w": np.ones(1)}, step=3)
    with pytest.raises(OSError, match="No space left on device"):
        store.wait()


def test_unwritable_metadata_fails_in_the_callers_thread(tmp_path):
    """Metadata that JSON cannot hold is refused at the call, not later in the background."""
    store = CheckpointStore(tmp_path)
    with pytest.raises(TypeError, match="not JSON serializable"):
        store.save_in_background({"w": np.ones(1)}, step=1, metadata={"bad": object()})
    assert store.wait() is None


def test_prune_keeps_latest_best_and_every_nth_together(tmp_path):
    """keep_latest, keep_best and keep_every combine; only checkpoints with the prefix are considered."""
    store = CheckpointStore(tmp_path)
    losses = {1: 0.9, 2: 0.2, 3: 0.5, 4: 0.8, 5: 0.1, 6: 0.7, 7: 0.6}
    for step, loss in losses.items():
        store.save({"w": np.zeros(1)}, step=step, metrics={"loss": loss})
    store.save({"w": np.zeros(1)}, step=1, name="other-1")
    deleted = store.prune(keep_latest=2, keep_best=2, metric="loss", mode="min", keep_every=3, prefix="step_")
    assert sorted(c.step for c in deleted) == [1, 4]
    assert [c.path.name for c in store.checkpoints()] == [
        "other-1",
        "step_00000002",
        "step_00000003",
        "step_00000005",
        "step_00000006",
        "step_00000007",
    ]


def test_prune_arguments_are_checked(tmp_path):
    """Non-positive counts, keep_best without a metric and a bad mode are refused."""
    store = CheckpointStore(tmp_path)
    with pytest.raises(ValueError, match=r"`keep_latest` must be a positive int or None, got 0"):
        store.prune(keep_latest=0)
    with pytest.raises(ValueError, match=r"`keep_best` needs `metric`"):
        store.prune(keep_best=2)
    with pytest.raises(ValueError, match=r"`mode` must be 'min' or 'max', got 'up'"):
        store.prune(keep_best=1, metric="loss", mode="up")  # type: ignore[arg-type]


def test_prune_without_a_policy_keeps_everything(tmp_path):
    """No policy means no deletion: `Checkpoint(n_saved=None)` keeps every checkpoint it writes."""
    store = CheckpointStore(tmp_path)
    for step in (1, 2, 3):
        store.save({"w": np.zeros(1)}, step=step)
    assert store.prune() == []
    assert [c.step for c in store.checkpoints()] == [1, 2, 3]


def test_background_saves_copy_cpu_device_arrays_into_reused_host_buffers():
    """Background saves copy CPU device arrays (device_get gives views) into host buffers kept for reuse."""
    from ember.checkpoint._format import detach

    pool: list[np.ndarray] = []
    state = {"w": jnp.arange(4.0), "n": np.arange(3), "k": 7}
    first = detach(state, pool)
    assert not np.shares_memory(first["w"], np.asarray(state["w"]))
    assert not np.shares_memory(first["n"], state["n"])
    assert first["k"] == 7
    second = detach({"w": state["w"] * 2, "n": state["n"], "k": 8}, pool)
    assert second["w"] is first["w"]  # the same host buffer, refilled
    assert second["w"].tolist() == [0.0, 2.0, 4.0, 6.0]


def test_device_snapshot_copies_accelerator_arrays_on_the_device(tmp_path, monkeypatch):
    """With device_snapshot=True an accelerator array is copied on the device and fetched by the writer.

    The CPU backend is the only one here, so the test makes the store treat CPU arrays as accelerator
    arrays: the save must then hand the writer a new device array, not the donated original.
    """
    from ember.checkpoint import _format as _snapshot

    monkeypatch.setattr(_snapshot, "_on_cpu", lambda x: False)
    state = {"w": jnp.arange(4.0), "n": np.arange(3), "k": 7}
    pool: list[np.ndarray] = []
    snap = _snapshot.detach(state, pool, on_device=True)
    assert isinstance(snap["w"], jax.Array)
    assert snap["w"].unsafe_buffer_pointer() != state["w"].unsafe_buffer_pointer()
    assert not np.shares_memory(snap["n"], state["n"])  # NumPy leaves still go to the host pool
    assert len(pool) == 1
    fetched = _snapshot.detach(state, [], on_device=False)
    assert isinstance(fetched["w"], np.ndarray)  # without the option: fetched to the host at once
    del fetched  # on CPU that is a view of the buffer, which would keep the step below from donating it

    store = CheckpointStore(tmp_path, device_snapshot=True)
    store.save_in_background(state, step=3)
    jax.jit(lambda w: w + 100.0, donate_argnums=0)(state["w"])  # the next step donates the state
    assert state["w"].is_deleted()
    tree, info = store.restore(checkpoint=store.wait())
    assert (info.step, tree["w"].tolist(), tree["n"].tolist(), tree["k"]) == (3, [0.0, 1.0, 2.0, 3.0], [0, 1, 2], 7)
    with pytest.raises(TypeError, match=r"`device_snapshot` must be True or False, got 'yes'"):
        CheckpointStore(tmp_path, device_snapshot="yes")  # type: ignore[arg-type]


def test_only_process_0_writes_and_deletes(tmp_path, monkeypatch):
    """On another process a save returns the checkpoint's info without writing, and prune deletes nothing."""
    store = CheckpointStore(tmp_path)
    store.save({"w": np.zeros(1)}, step=1)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    info = store.save({"w": np.zeros(1)}, step=2, metrics={"loss": 0.5})
    assert (info.step, info.metrics, info.path.name) == (2, {"loss": 0.5}, "step_00000002")
    assert store.save_in_background({"w": np.zeros(1)}, step=3).result().step == 3
    assert store.wait().step == 3
    assert store.prune(keep_latest=1) == []
    assert [c.step for c in store.checkpoints()] == [1]


def test_background_writes_run_at_a_lower_priority_than_training(tmp_path, monkeypatch):
    """The writer thread (and its checksum helper) yield the CPU to the training thread (Linux nice)."""
    import os
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("thread priorities are set on Linux only")
    seen = []
    real = store_module.write_leaves

    def write_leaves(f, leaves):
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return real(f, leaves)

    monkeypatch.setattr(store_module, "write_leaves", write_leaves)
    store = CheckpointStore(tmp_path)
    store.save_in_background({"w": np.zeros(4)}, step=1)
    store.wait()
    main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert seen == [min(main + 10, 19)]


def test_a_background_save_deletes_what_it_removes_once_it_is_committed(tmp_path):
    """removes=[...]: deleted on the writer thread after the new checkpoint commits; a name already gone is no error."""
    store = CheckpointStore(tmp_path)
    for step in (1, 2):
        store.save({"w": np.zeros(1)}, step=step)
    store.save_in_background({"w": np.ones(1)}, step=3, removes=["step_00000001", "step_00000009"])
    assert store.wait().step == 3
    assert [c.step for c in store.checkpoints()] == [2, 3]
