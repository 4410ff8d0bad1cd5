"""What an engine holds once: one bar of each kind, one checkpoint per folder (a notebook cell run again)."""

from __future__ import annotations

import weakref
from collections.abc import Hashable
from typing import Any

from ember.engine import Engine

#: by engine, by key: the handler holding it and its attachments not removed since (one per ``attach``)
_HELD: weakref.WeakKeyDictionary[Engine, dict[Hashable, tuple[Any, list[Any]]]] = weakref.WeakKeyDictionary()


def holder(engine: Engine, key: Hashable) -> Any:
    """The handler that holds ``key`` on ``engine`` (attached, not removed since), or ``None``."""
    return _HELD.get(engine, {}).get(key, (None, []))[0]


def let_go(engine: Engine, key: Hashable) -> None:
    """Remove what holds ``key`` on ``engine``: every registration of each of its attachments."""
    for made in list(_HELD.get(engine, {}).get(key, (None, []))[1]):
        made.handle.remove()


def hold(engine: Engine, key: Hashable, handler: Any, made: Any) -> None:
    """Record that ``handler`` holds ``key`` on ``engine``, until its every attachment holding it is removed.

    ``made`` is the `collect_handles` block of this attachment; its handle's ``remove()`` lets go of the key.
    """
    held = _HELD.setdefault(engine, {})
    attachments = held.setdefault(key, (handler, []))[1]
    attachments.append(made)

    def release() -> None:
        if made in attachments:
            attachments.remove(made)
        if not attachments and held.get(key, (None, None))[1] is attachments:
            del held[key]

    made.on_remove(release)
