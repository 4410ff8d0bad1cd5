"""Checkpoints: an atomic, verified store of pytrees and their metadata (msgpack or orbax), in one tier or two."""

from ember.checkpoint._folder import CheckpointFolder, check_retention
from ember.checkpoint._init_from import InitReport, init_from
from ember.checkpoint._manifest import CheckpointInfo, CorruptCheckpointError
from ember.checkpoint._orbax import OrbaxStore, open_store
from ember.checkpoint._store import CheckpointStore
from ember.checkpoint._tiered import TieredStore

__all__ = [
    "CheckpointFolder",
    "CheckpointInfo",
    "CheckpointStore",
    "CorruptCheckpointError",
    "InitReport",
    "OrbaxStore",
    "TieredStore",
    "check_retention",
    "init_from",
    "open_store",
]
