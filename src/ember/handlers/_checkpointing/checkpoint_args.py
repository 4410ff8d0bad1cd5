"""A `Checkpoint`'s arguments checked, each with a clear error; where its saves go (a store, or your handler)."""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from typing import Any, Literal

from ember.checkpoint import check_retention
from ember.checkpoint._stores import Store
from ember.handlers._checkpointing.checkpoint_files import StoreWriting
from ember.handlers._checkpointing.checkpoint_names import Naming
from ember.handlers._checkpointing.retention import Ledger
from ember.handlers._checkpointing.save_handlers import HandlerWriting
from ember.handlers._checkpointing.savers import DiskSaver


def destination(save_handler: Any) -> tuple[Any, Store | None]:
    """The handler as kept in ``save_handler``, and the store it writes to (``None`` for a user's handler)."""
    if isinstance(save_handler, Store):
        return save_handler, save_handler
    if isinstance(save_handler, DiskSaver):
        return save_handler, save_handler.store
    if isinstance(save_handler, str | os.PathLike):
        saver = DiskSaver(save_handler, require_empty=False)
        return saver, saver.store
    if save_handler is None:
        raise TypeError("`save_handler` is required: a folder, a CheckpointStore, a DiskSaver or a save handler.")
    if callable(save_handler):
        return save_handler, None
    raise TypeError(
        "`save_handler` must be a folder, a CheckpointStore, a DiskSaver, or a callable "
        f"(checkpoint, filename, metadata) such as a BaseSaveHandler; got {type(save_handler).__name__}."
    )


def check_arguments(
    to_save: Any,
    include_self: bool,
    score_function: Any,
    global_step_transform: Any,
    filename_pattern: Any,
    n_saved: Any,
    on_error: Any,
    *,
    keep_every: Any,
    mode: Any,
    keep_while: Any = None,
) -> None:
    """`Checkpoint`'s arguments checked, each a clear error naming it."""
    if not isinstance(to_save, Mapping) or not to_save:
        raise TypeError(f"`to_save` must be a non-empty mapping of names to objects, got {to_save!r}.")
    if include_self and not isinstance(to_save, MutableMapping):
        raise TypeError(f"`include_self=True` needs `to_save` to be mutable (a dict), got {type(to_save).__name__}.")
    if include_self and "checkpointer" in to_save:
        raise ValueError("`to_save` has the key 'checkpointer', which `include_self=True` saves this handler under.")
    if score_function is not None and not callable(score_function):
        raise TypeError(f"`score_function` must be callable as score_function(engine), got {score_function!r}.")
    if global_step_transform is not None and not callable(global_step_transform):
        raise TypeError(
            "`global_step_transform` must be callable as global_step_transform(engine, event_name), "
            f"got {global_step_transform!r}."
        )
    if filename_pattern is not None and not isinstance(filename_pattern, str):
        raise TypeError(f"`filename_pattern` must be a str or None, got {type(filename_pattern).__name__}.")
    if n_saved is not None and (not isinstance(n_saved, int) or isinstance(n_saved, bool) or n_saved < 1):
        raise ValueError(f"`n_saved` must be a positive int or None (keep every checkpoint), got {n_saved!r}.")
    if on_error not in ("raise", "warn"):
        raise ValueError(f'`on_error` must be "raise" or "warn", got {on_error!r}.')
    if keep_while is not None and not callable(keep_while):
        raise TypeError(f"`keep_while` must be callable as keep_while(step) -> bool, got {keep_while!r}.")
    check_retention(None, None, keep_every, mode)


def writing(
    save_handler: Any,
    store: Store | None,
    ledger: Ledger,
    naming: Naming,
    *,
    background: bool,
    on_error: Literal["raise", "warn"],
    mode: Literal["min", "max"],
    save_on_rank: int,
) -> StoreWriting | HandlerWriting:
    """Where a `Checkpoint`'s saves go: into the store (ember's), or through the save handler (yours)."""
    if store is not None:
        return StoreWriting(store, ledger, naming, background=background, on_error=on_error, mode=mode)
    return HandlerWriting(save_handler, ledger, naming, save_on_rank=save_on_rank, on_error=on_error)


def needs_store(writing: StoreWriting | None, what: str) -> StoreWriting:
    """``writing``, or the ``TypeError`` saying that ``what`` (a method's name) needs one of ember's stores."""
    if writing is None:
        raise TypeError(
            f"{what} reads ember's checkpoint store; this Checkpoint saves through your own save_handler. Load "
            "what it saved with Checkpoint.load_objects(to_load, checkpoint_dict)."
        )
    return writing
