"""Stock handlers: what a run reports and decides (checkpoints so far)."""

from ember.handlers._checkpoint import Checkpoint, global_step_from_engine, load_objects

__all__ = ["Checkpoint", "global_step_from_engine", "load_objects"]
