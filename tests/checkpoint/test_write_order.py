"""The order of durable operations: the files' bytes, then the manifest, then the rename, then the folder's fsync.

A kill test cannot see a missing fsync: the page cache survives the kill. These record each one.
"""

import os
import re
from pathlib import Path

import numpy as np
import pytest

from ember.checkpoint import CheckpointStore, OrbaxStore


@pytest.fixture
def durable_calls(monkeypatch):
    """Every ``os.fsync`` (by the path of its descriptor) and ``os.replace``, in order, while the test runs."""
    calls: list[tuple[str, ...]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        calls.append(("replace", str(src), str(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return calls


def relative(calls: list[tuple[str, ...]], root: Path) -> list[tuple[str, ...]]:
    """The calls with paths relative to ``root`` and each temporary folder's random name as ``<tmp>``."""

    def short(path: str) -> str:
        name = os.path.relpath(path, root)
        return re.sub(r"\.tmp-[^/]+", "<tmp>", name)

    return [(kind, *(short(p) for p in paths)) for kind, *paths in calls]


def test_the_native_store_makes_the_data_durable_before_the_manifest_and_both_before_the_rename(
    tmp_path, durable_calls
):
    """Foreground save: data file, manifest, the temporary folder, the rename into place, then the folder holding it."""
    CheckpointStore(tmp_path).save({"w": np.arange(4.0)}, step=1)
    assert relative(durable_calls, tmp_path) == [
        ("fsync", "<tmp>/state.msgpack"),
        ("fsync", "<tmp>/manifest.json"),
        ("fsync", "<tmp>"),
        ("replace", "<tmp>", "step_00000001"),
        ("fsync", "."),
    ]


def test_a_replacing_save_commits_beside_the_old_one_before_removing_it(tmp_path, durable_calls):
    """The same name saved again: the new folder lands beside the old, durably, before the old one goes."""
    store = CheckpointStore(tmp_path)
    store.save({"w": np.arange(4.0)}, step=1)
    durable_calls.clear()
    store.save({"w": np.arange(4.0) * 2}, step=1, replaces="step_00000001")
    assert relative(durable_calls, tmp_path)[3:] == [
        ("replace", "<tmp>", "step_00000001.replacing"),
        ("fsync", "."),
        ("replace", "step_00000001", "<tmp>"),  # the old one, renamed away, then deleted
        ("fsync", "."),
        ("replace", "step_00000001.replacing", "step_00000001"),
        ("fsync", "."),
    ]
    assert store.restore()[0]["w"].tolist() == [0.0, 2.0, 4.0, 6.0]


def test_an_amended_manifest_is_durable_before_it_replaces_the_old_one(tmp_path, durable_calls):
    """A manifest rewritten in place: a temporary file, fsynced, renamed over it, the checkpoint's folder fsynced."""
    store = CheckpointStore(tmp_path)
    store.save({"w": np.arange(4.0)}, step=1)
    durable_calls.clear()
    store.amend("step_00000001", metadata={"note": "epoch completed"})
    assert relative(durable_calls, tmp_path) == [
        ("fsync", "step_00000001/<tmp>"),
        ("replace", "step_00000001/<tmp>", "step_00000001/manifest.json"),
        ("fsync", "step_00000001"),
    ]


def test_the_orbax_store_makes_every_file_durable_before_the_manifest(tmp_path, durable_calls):
    """Every file orbax wrote (and each folder holding one) is fsynced before the manifest; then the rename."""
    store = OrbaxStore(tmp_path)
    info = store.save({"w": np.arange(1000.0), "b": np.ones(3)}, step=1)
    store.close()
    calls = relative(durable_calls, tmp_path)
    files = {f"<tmp>/{name}" for name in info.files}
    manifest = calls.index(("fsync", "<tmp>/manifest.json"))
    rename = calls.index(("replace", "<tmp>", "step_00000001"))
    assert files <= {path for kind, path, *_ in calls[:manifest] if kind == "fsync"}  # every recorded file, before
    assert ("fsync", "<tmp>") in calls[manifest:rename]
    assert calls[rename + 1 :] == [("fsync", ".")]
