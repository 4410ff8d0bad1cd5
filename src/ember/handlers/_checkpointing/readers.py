"""Checkpoint readers: which checkpoint a run starts from (latest, or best by a metric), if any."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from ember.checkpoint import CheckpointInfo, CorruptCheckpointError, open_store
from ember.checkpoint._store import Store
from ember.handlers._checkpointing.loading import load_objects


class CheckpointReader:
    """Picks the checkpoint to start from: the latest valid one (flax-extra's ``CheckpointFileReader``).

    [`load`][ember.handlers.CheckpointReader.load] restores objects from it, or returns ``None`` when the folder holds
    no valid checkpoint (it may not exist yet), so the same script starts from scratch the first time and resumes after.
    A checkpoint that turns out damaged while it is read (a checksum that does not match) is moved aside with a warning
    naming its folder and file, and the next one in line is used.

    Args:
        directory: a checkpoint folder (a [`CheckpointStore`][ember.checkpoint.CheckpointStore]'s root) or a store.

    Examples:
        >>> import tempfile
        >>> from ember import Engine
        >>> from ember.handlers import CheckpointReader
        >>> reader = CheckpointReader(tempfile.mkdtemp())
        >>> print(reader.load({"trainer": Engine(lambda e, b: b)}))  # nothing saved yet: start from scratch
        None
    """

    def __init__(self, directory: str | os.PathLike[str] | Store) -> None:
        self.store = directory if isinstance(directory, Store) else open_store(directory)

    def candidates(self) -> list[CheckpointInfo]:
        """The valid checkpoints, the one to use first."""
        return self.store.ranked()

    def select(self) -> CheckpointInfo | None:
        """The checkpoint [`load`][ember.handlers.CheckpointReader.load] would use, or ``None``."""
        found = self.candidates()
        return found[0] if found else None

    def load(self, to_load: Mapping[str, Any]) -> CheckpointInfo | None:
        """Restore ``to_load`` in place from the first checkpoint that reads back whole; ``None`` if none does.

        Nothing is changed unless a checkpoint was restored.
        """
        for info in self.candidates():
            try:
                return load_objects(to_load, info, store=self.store)
            except CorruptCheckpointError as why:
                self.store.set_aside(info.path, why)
        return None


class _BestReader(CheckpointReader):
    mode: Literal["min", "max"]

    def __init__(self, directory: str | os.PathLike[str] | Store, metric: str) -> None:
        super().__init__(directory)
        if not isinstance(metric, str) or not metric:
            raise TypeError(f"`metric` must be the name of a checkpoint metric, got {metric!r}.")
        self.metric = metric

    def candidates(self) -> list[CheckpointInfo]:
        """The valid checkpoints that carry ``metric``, best first."""
        return self.store.ranked(self.metric, self.mode)


class LowestCheckpointReader(_BestReader):
    """The checkpoint with the lowest value of ``metric`` (a validation loss), as flax-extra's reader.

    Args:
        directory: a checkpoint folder or store.
        metric: a metric saved with the checkpoints (a [`Checkpoint`][ember.handlers.Checkpoint]'s ``score_name``).

    Examples:
        >>> import tempfile, numpy as np
        >>> from ember.checkpoint import CheckpointStore
        >>> from ember.handlers import LowestCheckpointReader
        >>> store = CheckpointStore(tempfile.mkdtemp())
        >>> for step, loss in [(1, 0.5), (2, 0.2), (3, 0.4)]:
        ...     _ = store.save({"w": np.zeros(1)}, step=step, metrics={"loss": loss})
        >>> LowestCheckpointReader(store, "loss").select().step
        2
    """

    mode = "min"


class HighestCheckpointReader(_BestReader):
    """The checkpoint with the highest value of ``metric`` (a validation accuracy).

    Args:
        directory: a checkpoint folder or store.
        metric: a metric saved with the checkpoints.

    Examples:
        >>> import tempfile, numpy as np
        >>> from ember.checkpoint import CheckpointStore
        >>> from ember.handlers import HighestCheckpointReader
        >>> store = CheckpointStore(tempfile.mkdtemp())
        >>> for step, acc in [(1, 0.5), (2, 0.9), (3, 0.7)]:
        ...     _ = store.save({"w": np.zeros(1)}, step=step, metrics={"acc": acc})
        >>> HighestCheckpointReader(store, "acc").select().step
        2
    """

    mode = "max"
