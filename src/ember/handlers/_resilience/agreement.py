"""Decisions every process of a multi-process run takes together: how often handlers agree, and on what."""

from __future__ import annotations

from ember._multiprocess import any_process

__all__ = ["MULTI_PROCESS_CHECK_EVERY", "any_process", "check_interval", "positive_or_none"]


#: Iterations between agreement checks in a multi-process run, unless a handler is given ``check_every``.
MULTI_PROCESS_CHECK_EVERY = 10


def check_interval(check_every: int | None) -> int:
    """``check_every``, or by default 1 in a single process (a local test) and 10 in several (a collective).

    Every process computes the same interval, so all check, and agree, at the same iterations.

    Examples:
        >>> from ember.handlers._resilience.agreement import check_interval
        >>> check_interval(None), check_interval(4)
        (1, 4)
    """
    if check_every is not None:
        return check_every
    import jax

    return 1 if jax.process_count() == 1 else MULTI_PROCESS_CHECK_EVERY


def positive_or_none(name: str, value: object) -> int | None:
    """``value`` if it is a positive int or ``None``; else a ``ValueError`` naming ``name``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"`{name}` must be a positive int or None (the default spacing), got {value!r}.")
    return value
