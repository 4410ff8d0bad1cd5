"""Disk full and permission denied during a save: a clear error, or a warning and training goes on."""

import errno
import re

import pytest

import ember.checkpoint._msgpack as store_module
from ember import Engine, Events
from ember.checkpoint import CheckpointStore
from ember.handlers import Checkpoint


def failing_at(monkeypatch, step, error):
    """Make the write of the checkpoint for ``step`` fail with ``error`` (others go through)."""
    real = store_module.write_leaves

    def write_leaves(f, leaves):
        if dict(leaves).get("trainer/iteration") == step or f"step_{step:08d}" in f.name:
            raise error
        return real(f, leaves)

    monkeypatch.setattr(store_module, "write_leaves", write_leaves)


def run(tmp_path, on_error):
    trainer = Engine(lambda e, b: b)
    saver = Checkpoint({"trainer": trainer}, tmp_path, n_saved=None, on_error=on_error)
    saver.attach(trainer, Events.ITERATION_COMPLETED(every=2))
    seen = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(e.state.iteration))
    return trainer, seen


DISK_FULL = OSError(errno.ENOSPC, "No space left on device")
DENIED = PermissionError(errno.EACCES, "Permission denied")


@pytest.mark.parametrize("error", [DISK_FULL, DENIED], ids=["disk-full", "permission-denied"])
def test_a_failed_save_fails_the_run_with_that_error_and_keeps_earlier_checkpoints(tmp_path, monkeypatch, error):
    failing_at(monkeypatch, 4, error)
    trainer, seen = run(tmp_path, "raise")
    with pytest.raises(type(error), match=re.escape(error.strerror)):
        trainer.run(range(8))
    assert seen[-1] < 8  # the run stopped at the next event after the background failure
    assert [c.step for c in CheckpointStore(tmp_path).checkpoints()] == [2]
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000002"]  # no partial checkpoint left behind


@pytest.mark.parametrize("error", [DISK_FULL, DENIED], ids=["disk-full", "permission-denied"])
def test_with_on_error_warn_training_goes_on(tmp_path, monkeypatch, error):
    failing_at(monkeypatch, 4, error)
    trainer, seen = run(tmp_path, "warn")
    with pytest.warns(RuntimeWarning, match=re.escape(f"A checkpoint could not be written ({type(error).__name__}: ")):
        trainer.run(range(8))
    assert seen == list(range(1, 9))
    assert [c.step for c in CheckpointStore(tmp_path).checkpoints()] == [2, 6, 8]


def test_on_error_is_checked():
    message = '`on_error` must be "raise" or "warn", got \'ignore\'.'
    with pytest.raises(ValueError, match=re.escape(message)):
        Checkpoint({"trainer": Engine(lambda e, b: b)}, "unused", on_error="ignore")  # type: ignore[arg-type]
