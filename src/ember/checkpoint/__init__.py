"""Checkpoints: an atomic, verified store of pytrees with their metadata (msgpack, or orbax for sharded state)."""

from ember.checkpoint._manifest import CorruptCheckpointError
from ember.checkpoint._orbax import OrbaxStore
from ember.checkpoint._store import CheckpointInfo, CheckpointStore

__all__ = ["CheckpointInfo", "CheckpointStore", "CorruptCheckpointError", "OrbaxStore"]
