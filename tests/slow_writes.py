"""A slow disk for the tests: every checkpoint write of the folder store takes longer (a network file system)."""

import time


def slow_checkpoint_writes(monkeypatch, seconds):
    """Make every ``CheckpointStore`` write (and so a ``TieredStore``'s) take ``seconds`` more, for one test."""
    from ember.checkpoint import CheckpointStore

    write = CheckpointStore._write_files

    def slow(self, prepared):
        time.sleep(seconds)
        return write(self, prepared)

    monkeypatch.setattr(CheckpointStore, "_write_files", slow)
