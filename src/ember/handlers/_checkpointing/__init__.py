"""Checkpointing: `Checkpoint` and its parts, Ignite's savers and save handlers, readers, `load_objects`."""
