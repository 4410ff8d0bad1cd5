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
