"""A `Checkpoint`'s arguments checked, each with a clear error."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from ember.checkpoint import check_retention


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
