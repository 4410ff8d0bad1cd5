"""Where checkpoints go, Ignite's way: `DiskSaver`, and `global_step_from_engine` for naming them."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ember.checkpoint import CheckpointStore
from ember.engine import Engine


class DiskSaver:
    """Ignite's ``DiskSaver``: a folder for ``Checkpoint``, as a ``CheckpointStore``.

    A thin mapping: ember's store writes every checkpoint atomically (a temporary folder, fsynced,
    renamed), so ``atomic=False`` is refused rather than ignored.

    Args:
        dirname: the folder.
        atomic: must be ``True``.
        create_dir: create the folder if it is missing (else it must exist).
        require_empty: refuse a folder that already holds checkpoints (Ignite's default), so two runs never
            mix; pass ``False`` to add to it, or to resume from it.

    Examples:
        >>> import tempfile
        >>> from ember import Engine
        >>> from ember.handlers import Checkpoint, DiskSaver
        >>> trainer = Engine(lambda e, b: b)
        >>> saver = Checkpoint({"trainer": trainer}, DiskSaver(tempfile.mkdtemp()), "mnist", n_saved=2)
        >>> _ = trainer.run([1, 2]); saver(trainer); saver.last_checkpoint.name
        'mnist_step_00000002'
    """

    def __init__(
        self, dirname: str | os.PathLike[str], atomic: bool = True, create_dir: bool = True, require_empty: bool = True
    ) -> None:
        if atomic is not True:
            raise ValueError(
                "`atomic` must be True: ember writes every checkpoint atomically, and cannot do otherwise."
            )
        folder = os.fspath(dirname)
        if not create_dir and not os.path.isdir(folder):
            raise ValueError(f"`dirname` {folder!r} does not exist, and create_dir=False.")
        self.store = CheckpointStore(folder)
        if require_empty and self.store.checkpoints():
            names = ", ".join(c.path.name for c in self.store.checkpoints()[:3])
            raise ValueError(
                f"`dirname` {folder!r} already holds checkpoints ({names}, ...); pass require_empty=False to add "
                "to them or to resume from them."
            )

    def __repr__(self) -> str:
        return f"DiskSaver({str(self.store.root)!r})"


def global_step_from_engine(engine: Engine, custom_event_name: Any = None) -> Callable[..., int]:
    """A ``global_step_transform`` giving ``engine``'s counter, for a handler on another engine (Ignite's).

    The counter is the one the event counts by: the iteration for iteration events, the epoch for epoch
    events, ``STARTED`` and ``COMPLETED`` (``custom_event_name`` picks the event instead of the one that
    fired). Called with the engine alone, it gives the iteration.

    Examples:
        >>> from ember import Engine, Events
        >>> from ember.handlers import global_step_from_engine
        >>> trainer, evaluator = Engine(lambda e, b: b), Engine(lambda e, b: b)
        >>> _ = trainer.run([1, 2, 3], max_epochs=2)
        >>> step = global_step_from_engine(trainer)
        >>> step(evaluator, Events.COMPLETED), step(evaluator, Events.ITERATION_COMPLETED), step(evaluator)
        (2, 6, 6)
    """

    def global_step(_: Engine, event_name: Any = None) -> int:
        event = custom_event_name if custom_event_name is not None else event_name
        return engine.state.iteration if event is None else engine.get_event_attrib_value(event)

    return global_step
