"""The manifest's own checksum: any damage to manifest.json is found, named, and never misread."""

import json
import re

import numpy as np
import pytest

from ember.checkpoint import CheckpointStore, CorruptCheckpointError


def test_every_single_bit_flip_in_a_manifest_is_found_or_harmless(tmp_path):
    """Each of the manifest's bits flipped in turn: verify() raises naming the file, or reads the same manifest."""
    store = CheckpointStore(tmp_path)
    info = store.save({"w": np.arange(3, dtype=np.float32)}, step=2, metrics={"loss": 0.25})
    path = info.path / "manifest.json"
    good = path.read_bytes()
    found = harmless = 0
    messages: set[str] = set()
    for i in range(len(good)):
        for bit in range(8):
            flipped = bytearray(good)
            flipped[i] ^= 1 << bit
            path.write_bytes(bytes(flipped))
            try:
                back = store.verify(info.path)
            except CorruptCheckpointError as e:
                messages.add(str(e).split(" is corrupt: its manifest.json ")[0])
                found += 1
            else:
                assert back.manifest == info.manifest  # a flip inside white space: nothing changed
                harmless += 1
    path.write_bytes(good)
    assert found > 0.95 * 8 * len(good), (found, harmless)
    assert messages == {f"Checkpoint {str(info.path)!r}"}  # every one names the folder and the file


def test_a_flipped_dtype_is_reported_as_damage_not_as_a_model_mismatch(tmp_path):
    """'float32' turned into 'floa432' is a corrupt manifest, with the folder named, not a structure error."""
    store = CheckpointStore(tmp_path)
    info = store.save({"w": np.zeros(2, np.float32)}, step=1)
    path = info.path / "manifest.json"
    path.write_text(path.read_text().replace('"float32"', '"floa432"'))
    with pytest.raises(
        CorruptCheckpointError,
        match=re.escape(
            f"Checkpoint {str(info.path)!r} is corrupt: its manifest.json does not match its own checksum (it was "
            "changed or damaged on disk)."
        ),
    ):
        store.restore(target={"w": np.zeros(2, np.float32)}, checkpoint=store.verify(info.path))


def test_a_manifest_written_before_checksums_is_still_read(tmp_path):
    """Format 1 manifests (no checksum) restore as before; a newer one without its checksum does not."""
    store = CheckpointStore(tmp_path)
    info = store.save({"w": np.ones(2, np.float32)}, step=1)
    manifest = json.loads((info.path / "manifest.json").read_text())
    del manifest["checksum"]
    (info.path / "manifest.json").write_text(json.dumps({**manifest, "format": 1}))
    tree, restored = store.restore()
    assert (restored.step, tree["w"].tolist()) == (1, [1.0, 1.0])
    (info.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpointError, match=re.escape("its manifest.json has no checksum.")):
        store.verify(info.path)
