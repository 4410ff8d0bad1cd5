"""What an engine holds once: one bar of each kind, one checkpoint per folder (a notebook cell run again)."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Hashable
from typing import Any

from ember.engine import Engine

#: by engine, by key: the handler holding it and its attachments not removed since (one per ``attach``)
_HELD: weakref.WeakKeyDictionary[Engine, dict[Hashable, tuple[Any, list[Any]]]] = weakref.WeakKeyDictionary()


def hold(engine: Engine, key: Hashable, handler: Any, made: Any, *, if_held: str, refuse: bool) -> None:
    """Record that ``handler`` holds ``key`` on ``engine``, until its every attachment holding it is removed.

    Call it first in the `collect_handles` block ``made`` of the attachment; its handle's ``remove()`` lets go of the
    key. Where another handler holds ``key``, ``if_held`` says so: as a `ValueError` with ``refuse`` (nothing is
    attached), else as a warning, the other handler's attachments removed and this one taking its place.
    """
    held = _HELD.setdefault(engine, {})
    other, attachments = held.get(key, (None, []))
    if other is not None and other is not handler:
        if refuse:
            raise ValueError(if_held)
        for attachment in list(attachments):
            attachment.handle.remove()
        warnings.warn(if_held, stacklevel=3)
    attachments = held.setdefault(key, (handler, []))[1]
    attachments.append(made)

    def release() -> None:
        if made in attachments:
            attachments.remove(made)
        if not attachments and held.get(key, (None, None))[1] is attachments:
            del held[key]

    made.on_remove(release)
