"""Users' own save handlers, Ignite's way: the protocol, the checkpoint dict they receive, and file names.

A ``Checkpoint`` writes into one of ember's stores by default (atomic, verified, in the background). Its
``save_handler`` may instead be a function ``(checkpoint, filename, metadata)`` or an object with Ignite's
``BaseSaveHandler`` methods (``__call__``, ``remove``): a saver to S3 or a database, or a mock in a test.
Such a handler is called on the training thread with a plain dict of host values, as Ignite calls it
(`destinations.HandlerDestination`).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class SaveHandler(Protocol):
    """What a ``Checkpoint`` calls to save and remove checkpoints of its own: Ignite's ``BaseSaveHandler`` methods.

    ``__call__(checkpoint, filename, metadata)`` saves ``checkpoint`` (a dict of host values: NumPy arrays, Python
    numbers and containers) under ``filename``; ``metadata`` holds ``basename``, ``score_name`` and ``priority``.
    ``remove(filename)`` deletes a checkpoint the handler's ``n_saved`` no longer keeps; it is called after the
    checkpoint that replaces it was saved. A plain function with ``__call__``'s signature (or just
    ``(checkpoint, filename)``) is a save handler that removes nothing.

    Examples:
        >>> from ember.handlers import SaveHandler
        >>> class Recorder:
        ...     def __call__(self, checkpoint, filename, metadata=None): print("save", filename)
        ...     def remove(self, filename): print("remove", filename)
        >>> isinstance(Recorder(), SaveHandler)
        True
    """

    def __call__(self, checkpoint: Mapping[str, Any], filename: str, metadata: Mapping[str, Any] | None = None) -> None:
        """Save ``checkpoint`` under ``filename``."""
        ...

    def remove(self, filename: str) -> None:
        """Delete the checkpoint saved under ``filename``."""
        ...


class BaseSaveHandler(ABC):
    """Ignite's base class for save handlers: subclass it and implement ``__call__`` and ``remove``.

    Examples:
        >>> import tempfile
        >>> from ember import Engine, Events
        >>> from ember.handlers import BaseSaveHandler, Checkpoint
        >>> class InMemory(BaseSaveHandler):
        ...     def __init__(self): self.files = {}
        ...     def __call__(self, checkpoint, filename, metadata=None): self.files[filename] = checkpoint
        ...     def remove(self, filename): del self.files[filename]
        >>> trainer, saver = Engine(lambda e, b: b), InMemory()
        >>> _ = trainer.add_event_handler(Events.EPOCH_COMPLETED, Checkpoint({"trainer": trainer}, saver))
        >>> _ = trainer.run([1, 2], max_epochs=3)
        >>> saver.files
        {'trainer_6.ckpt': {'epoch_length': 2, 'iteration': 6, 'max_epochs': 3}}
    """

    @abstractmethod
    def __call__(self, checkpoint: Mapping[str, Any], filename: str, metadata: Mapping[str, Any] | None = None) -> None:
        """Save ``checkpoint`` under ``filename``; ``metadata`` holds ``basename``, ``score_name``, ``priority``."""

    @abstractmethod
    def remove(self, filename: str) -> None:
        """Delete the checkpoint saved under ``filename``."""


def takes_metadata(save_handler: Callable[..., Any]) -> bool:
    """Whether ``save_handler`` takes ``(checkpoint, filename, metadata)``, or only ``(checkpoint, filename)``.

    Decided once, from the signature (Ignite retries after any ``TypeError``, which would run a failing handler
    twice); a handler that takes neither is refused when the ``Checkpoint`` is made.
    """
    try:
        sig = inspect.signature(save_handler)
    except (TypeError, ValueError):  # no signature to read: Ignite's three arguments
        return True
    for args in ((None, "", None), (None, "")):
        try:
            sig.bind(*args)
            return len(args) == 3
        except TypeError:
            continue
    raise TypeError(
        f"`save_handler` must take (checkpoint, filename, metadata) or (checkpoint, filename), as Ignite calls it; "
        f"{getattr(save_handler, '__qualname__', type(save_handler).__name__)}{sig} does not."
    )


def setup_filename_pattern(
    with_prefix: bool = True, with_score: bool = True, with_score_name: bool = True, with_global_step: bool = True
) -> str:
    """Ignite's default checkpoint file name pattern, with the parts asked for.

    Raises:
        ValueError: neither a score nor a global step, or a score name without a score.

    Examples:
        >>> from ember.handlers import Checkpoint
        >>> Checkpoint.setup_filename_pattern()
        '{filename_prefix}_{name}_{global_step}_{score_name}={score}.{ext}'
        >>> Checkpoint.setup_filename_pattern(False, True, False, False)
        '{name}_{score}.{ext}'
    """
    if not (with_global_step or with_score):
        raise ValueError("At least one of `with_score` and `with_global_step` must be True: a name needs one of them.")
    pattern = "{name}"
    if with_global_step:
        pattern += "_{global_step}"
    if with_score and with_score_name:
        pattern += "_{score_name}={score}"
    elif with_score:
        pattern += "_{score}"
    elif with_score_name:
        raise ValueError("`with_score_name=True` needs `with_score=True`: the name labels the score.")
    if with_prefix:
        pattern = "{filename_prefix}_" + pattern
    return pattern + ".{ext}"


def render_filename(pattern: str, parts: Mapping[str, Any]) -> str:
    """``pattern`` filled from ``parts``; an unknown field is named, with the fields there are."""
    try:
        return pattern.format(**parts)
    except (KeyError, IndexError) as e:
        raise ValueError(
            f"`filename_pattern` {pattern!r} uses the field {e}; it may use {', '.join(sorted(parts))}."
        ) from None
