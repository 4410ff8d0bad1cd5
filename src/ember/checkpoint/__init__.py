"""Checkpoints: an atomic, verified store of pytrees with their metadata."""

from ember.checkpoint._store import CheckpointInfo, CheckpointStore

__all__ = ["CheckpointInfo", "CheckpointStore"]
