"""`ModelCheckpoint`: Ignite's checkpoint handler that is given what to save when it is attached."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from ember.engine import Engine
from ember.handlers._checkpointing.checkpoint import Checkpoint
from ember.handlers._checkpointing.savers import DiskSaver


class ModelCheckpoint(Checkpoint):
    """Ignite's ``ModelCheckpoint``: a ``Checkpoint`` into a folder, given ``to_save`` as a handler argument.

    Ignite's usage carries over: ``trainer.add_event_handler(Events.EPOCH_COMPLETED, handler, {"model": trainer})``; the
    mapping passed there is what each call saves (a trainer, an engine, handlers). It saves before returning
    (``background=False``), as it cannot know when the run ends to wait for a background write; use
    [`Checkpoint`][ember.handlers.Checkpoint] and its ``attach`` for background saves.

    Args:
        dirname: the folder (a [`DiskSaver`][ember.handlers.DiskSaver] with ``atomic``, ``create_dir``,
            ``require_empty``).
        filename_prefix: as [`Checkpoint`][ember.handlers.Checkpoint]'s.
        score_function: as [`Checkpoint`][ember.handlers.Checkpoint]'s.
        score_name: as [`Checkpoint`][ember.handlers.Checkpoint]'s.
        n_saved: as [`Checkpoint`][ember.handlers.Checkpoint]'s.
        atomic: must be ``True`` (every write is atomic).
        require_empty: refuse a folder that already holds checkpoints.
        create_dir: create the folder if it is missing.
        global_step_transform: as [`Checkpoint`][ember.handlers.Checkpoint]'s.
        filename_pattern: as [`Checkpoint`][ember.handlers.Checkpoint]'s.
        include_self: as [`Checkpoint`][ember.handlers.Checkpoint]'s.
        greater_or_equal: as [`Checkpoint`][ember.handlers.Checkpoint]'s.
        save_on_rank: as [`Checkpoint`][ember.handlers.Checkpoint]'s.

    Examples:
        >>> import tempfile
        >>> from ember import Engine, Events
        >>> from ember.handlers import ModelCheckpoint
        >>> trainer = Engine(lambda e, b: b)
        >>> handler = ModelCheckpoint(tempfile.mkdtemp(), "mnist", n_saved=2)
        >>> _ = trainer.add_event_handler(Events.EPOCH_COMPLETED, handler, {"trainer": trainer})
        >>> _ = trainer.run([1, 2], max_epochs=3)
        >>> [c.path.name for c in handler.store.checkpoints()]
        ['mnist_step_00000004', 'mnist_step_00000006']
    """

    def __init__(
        self,
        dirname: str | os.PathLike[str],
        filename_prefix: str = "",
        score_function: Callable[[Engine], float] | None = None,
        score_name: str | None = None,
        n_saved: int | None = 1,
        atomic: bool = True,
        require_empty: bool = True,
        create_dir: bool = True,
        global_step_transform: Callable[[Engine, Any], int] | None = None,
        filename_pattern: str | None = None,
        include_self: bool = False,
        greater_or_equal: bool = False,
        save_on_rank: int = 0,
    ) -> None:
        saver = DiskSaver(dirname, atomic=atomic, create_dir=create_dir, require_empty=require_empty)
        placeholder = {"_": _Nothing()}  # what to save arrives with each call
        super().__init__(
            placeholder,
            saver,
            filename_prefix,
            score_function,
            score_name,
            n_saved,
            global_step_transform,
            filename_pattern,
            include_self,
            greater_or_equal,
            save_on_rank,
            background=False,
        )

    # the ignore below: Ignite's ModelCheckpoint takes to_save at call time
    def __call__(self, engine: Engine, to_save: Mapping[str, Any] | None = None) -> None:  # type: ignore[override]
        """Save ``to_save`` (Ignite passes it as the handler's argument) now; retention applied."""
        if to_save is None:
            raise TypeError(
                "ModelCheckpoint saves what it is given: add it with "
                "engine.add_event_handler(event, handler, {'name': object, ...})."
            )
        if to_save is not self.to_save:
            if not isinstance(to_save, Mapping) or not to_save:
                raise TypeError(f"`to_save` must be a non-empty mapping of names to objects, got {to_save!r}.")
            if self.include_self and "checkpointer" in to_save:
                raise ValueError(
                    "`to_save` has the key 'checkpointer', which `include_self=True` saves this handler under."
                )
            self._given(to_save)
        super().__call__(engine)


class _Nothing:
    """Stands in for ``to_save`` until the first call brings it."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        del state_dict
