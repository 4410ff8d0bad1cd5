"""Checkpoints: an atomic, verified store of pytrees with their metadata (msgpack, or orbax for sharded state)."""

from ember.checkpoint._folder import CheckpointFolder, check_retention
from ember.checkpoint._info import CheckpointInfo
from ember.checkpoint._manifest import CorruptCheckpointError
from ember.checkpoint._orbax import OrbaxStore, open_store
from ember.checkpoint._store import CheckpointStore

__all__ = [
    "CheckpointFolder",
    "CheckpointInfo",
    "CheckpointStore",
    "CorruptCheckpointError",
    "OrbaxStore",
    "check_retention",
    "open_store",
]
