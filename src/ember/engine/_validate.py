"""`Engine.run`'s arguments: checks done before anything changes, and how they meet a run in progress."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from ember.engine._state import State


def check_process_fn(process_fn: object) -> None:
    """Raise unless ``process_fn`` can be called as ``process_fn(engine, batch)`` (``Engine``'s argument)."""
    if process_fn is None:
        raise ValueError("`process_fn` must be callable as process_fn(engine, batch), got None.")
    if not callable(process_fn):
        raise TypeError(f"`process_fn` must be callable as process_fn(engine, batch), got {process_fn!r}.")
    try:
        inspect.signature(process_fn).bind(None, None)
    except TypeError:
        raise ValueError(
            f"`process_fn` must accept (engine, batch); {getattr(process_fn, '__qualname__', process_fn)}"
            f"{inspect.signature(process_fn)} does not."
        ) from None
    except ValueError:  # no signature to inspect: trust it
        pass


def check_count(name: str, value: object) -> None:
    """Raise unless ``value`` is ``None`` or a positive int."""
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"`{name}` must be a positive int or None, got {type(value).__name__} {value!r}.")
    if value <= 0:
        raise ValueError(f"`{name}` must be a positive int, got {value}.")


def check_run_args(
    data: Iterable[Any] | None, max_epochs: int | None, max_iters: int | None, epoch_length: int | None
) -> None:
    """Validate the arguments of ``run()``: types, ranges, and combinations."""
    if data is not None:
        if not isinstance(data, Iterable):
            raise TypeError(
                f"`data` must be an iterable of batches (a list, a generator, a data loader) or None, "
                f"got {type(data).__name__}."
            )
        if length_of(data) == 0:
            raise ValueError("`data` is empty; pass at least one batch.")
    check_count("max_epochs", max_epochs)
    check_count("max_iters", max_iters)
    check_count("epoch_length", epoch_length)
    if max_epochs is not None and max_iters is not None:
        raise ValueError(
            f"`max_epochs` and `max_iters` are mutually exclusive; got max_epochs={max_epochs} and "
            f"max_iters={max_iters}. Pass one of them."
        )


def check_mode(st: State, max_epochs: int | None, max_iters: int | None) -> None:
    """Refuse to switch a run between ``max_epochs`` and ``max_iters`` without a reset, as Ignite does."""
    if max_iters is not None and st.max_epochs is not None:
        raise ValueError(
            f"`max_iters`={max_iters} was given, but this engine's run counts epochs (state.max_epochs="
            f"{st.max_epochs}); to switch to max_iters, first reset with engine.state.max_epochs = None, "
            "which starts a new run from iteration 0."
        )
    if max_epochs is not None and st.max_iters is not None:
        raise ValueError(
            f"`max_epochs`={max_epochs} was given, but this engine's run counts iterations (state.max_iters="
            f"{st.max_iters}); to switch to max_epochs, first reset with engine.state.max_iters = None, "
            "which starts a new run from iteration 0."
        )


def restart_hint(st: State) -> str:
    """How to start this engine's run again from zero: clear the limit the run counts by."""
    name = "max_iters" if st.max_iters is not None else "max_epochs"
    return f"set engine.state.{name} = None to restart from zero"


def already_complete(st: State) -> str:
    end = (
        f"iteration {st.iteration} of {st.max_iters}"
        if st.max_iters is not None
        else (f"epoch {st.epoch} of {st.max_epochs}, iteration {st.iteration}")
    )
    return (
        f"The run loaded by load_state_dict() is already complete ({end}); run() does nothing. Pass a larger "
        f"max_epochs (or max_iters) to train further, or {restart_hint(st)}."
    )


def ended_by_terminate(st: State) -> str:
    return (
        f"The run loaded by load_state_dict() was ended by terminate() at epoch {st.epoch}, iteration "
        f"{st.iteration} (a handler's decision: early stopping, a time limit, a NaN); run() does nothing. To train "
        f"on from there, set engine.should_terminate = False first; to start over, {restart_hint(st)}."
    )


def same_data(a: object, b: object) -> bool:
    """Whether ``run(a)`` passes the data the run already has (the same object, or an equal one)."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # arrays compare element-wise and refuse bool(): treat as different data
        return False


ENDLESS = 2**50  # a len() no data set reaches: Grain gives repeat()ed datasets sys.maxsize (then batched: less)


def length_of(data: object) -> int | None:
    """``len(data)``, or ``None`` for data without one (a ``len()`` that raises ``TypeError`` counts as none)."""
    try:
        return len(data)  # type: ignore[arg-type]  # only called for data that has a len (checked by the caller)
    except TypeError:
        return None


def data_length(data: Iterable[Any]) -> int | None:
    n = length_of(data)
    if n is None:
        return None
    if n == 0:
        raise ValueError("`data` is empty; pass at least one batch.")
    if n >= ENDLESS:
        raise ValueError(
            f"`data` is endless (its len() is {n}, as Grain's repeat() makes it), so it has no epochs of its own; "
            "pass epoch_length= (batches per epoch) to run()."
        )
    return n
