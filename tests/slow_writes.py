"""A slow disk for the tests: every checkpoint write of the folder store takes longer (a network file system)."""

import time


def slow_checkpoint_writes(monkeypatch, seconds):
    """Make every msgpack write (a ``CheckpointStore``'s, each tier's of a ``TieredStore``) take ``seconds`` more."""
    from ember.checkpoint._msgpack import MsgpackFormat
    from ember.checkpoint._shards import ShardFormat

    for format in (MsgpackFormat, ShardFormat):
        write = format.write

        def slow(self, draft, root, write=write):
            time.sleep(seconds)
            return write(self, draft, root)

        monkeypatch.setattr(format, "write", slow)


def held_checkpoint_writes(monkeypatch):
    """Hold every msgpack array write until the event returned is set (at most 60 s); return the event."""
    import threading

    import ember.checkpoint._msgpack as store_module

    release = threading.Event()
    real_write = store_module.write_leaves

    def held_write(f, leaves):
        assert release.wait(timeout=60), "the write was never released"
        return real_write(f, leaves)

    monkeypatch.setattr(store_module, "write_leaves", held_write)
    return release
