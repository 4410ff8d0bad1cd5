"""What ``run()`` does before the loop starts: start a new run, continue one, or switch data.

Functions over the engine's `Loop`: they have no state of their own.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from ember.engine._loop import Loop
from ember.engine._validate import (
    already_complete,
    check_mode,
    check_run_args,
    data_length,
    ended_by_terminate,
    restart_hint,
    same_data,
)


def set_data(loop: Loop, data: Iterable[Any]) -> None:
    """Switch the data source: the next batch comes from the start of ``data`` (``Engine.set_data``)."""
    if not isinstance(data, Iterable):
        raise TypeError(f"`data` must be an iterable of batches, got {type(data).__name__}.")
    loop.data.release()
    state = loop.engine.state
    state.dataloader = loop.wrap_data(data)
    loop.data.start(data, state.dataloader)


def prepare_run(
    loop: Loop,
    data: Iterable[Any] | None,
    max_epochs: int | None = None,
    max_iters: int | None = None,
    epoch_length: int | None = None,
) -> bool:
    """Set up the run ``run()`` asked for; ``False`` when there is nothing to run (a finished run was loaded)."""
    if loop.running:
        raise RuntimeError(
            "run() was called while this engine is running (from a handler or the process function); "
            "use a second Engine, or call terminate()/interrupt() instead."
        )
    check_run_args(data, max_epochs, max_iters, epoch_length)
    st = loop.engine.state
    check_mode(st, max_epochs, max_iters)
    if st.max_epochs is not None or st.max_iters is not None:  # a run exists: apply what the caller changes
        _update_limits(st, max_epochs, max_iters, epoch_length)
    progress = loop.progress
    if progress.loaded and loop.signals.terminate:  # loaded from a run a handler ended (early stopping, ...)
        warnings.warn(ended_by_terminate(st), UserWarning, stacklevel=3)
        return False
    if st.max_epochs is None and st.max_iters is None:
        _start_new_run(loop, data, max_epochs, max_iters, epoch_length)
    elif not loop.suspended() and progress.done(st):
        if progress.loaded:
            warnings.warn(already_complete(st), UserWarning, stacklevel=3)
            return False
        _start_new_run(loop, data, max_epochs, max_iters, epoch_length)
    else:
        _continue_run(loop, data)
        until = f"{st.max_iters} iterations" if st.max_iters is not None else f"{st.max_epochs} epochs"
        loop.engine.logger.info(
            "Engine run resuming from iteration %d, epoch %d until %s", st.iteration, st.epoch, until
        )
    progress.loaded = False
    loop.start()
    return True


def _start_new_run(
    loop: Loop,
    data: Iterable[Any] | None,
    max_epochs: int | None,
    max_iters: int | None,
    epoch_length: int | None,
) -> None:
    st = loop.engine.state
    if epoch_length is None:
        if data is None:
            raise ValueError("`epoch_length` is required when `data` is None: the engine cannot count batches.")
        epoch_length = data_length(data)
    if max_iters is None and max_epochs is None:
        max_epochs = 1
    st.iteration = st.epoch = 0
    st.max_epochs, st.max_iters, st.epoch_length = max_epochs, max_iters, epoch_length
    loop.data.release()
    st.dataloader = None if data is None else loop.wrap_data(data)
    loop.data.start(data)
    loop.drop_run()
    loop.progress.restart()
    loop.reset_filters()
    limit = f"max_iters={max_iters}" if max_iters is not None else f"max_epochs={max_epochs}"
    loop.engine.logger.info("Engine run starting with %s.", limit)


def _update_limits(st: Any, max_epochs: int | None, max_iters: int | None, epoch_length: int | None) -> None:
    for name, value, reached in (("max_epochs", max_epochs, "epoch"), ("max_iters", max_iters, "iteration")):
        if value is not None and value < getattr(st, reached):
            raise ValueError(
                f"`{name}`={value} is below the {reached} this engine reached ({getattr(st, reached)}); pass a "
                f"larger value to continue, or {restart_hint(st)}."
            )
        if value is not None:
            setattr(st, name, value)
    if epoch_length is not None and epoch_length != st.epoch_length:
        raise ValueError(
            f"`epoch_length`={epoch_length} differs from the run being continued ({st.epoch_length}); "
            f"omit it, or {restart_hint(st)}."
        )


def _continue_run(loop: Loop, data: Iterable[Any] | None) -> None:
    st = loop.engine.state
    if data is None and st.dataloader is None and st.epoch_length is None:
        raise ValueError("`epoch_length` is required when `data` is None: the engine cannot count batches.")
    if data is not None and not same_data(data, loop.data.source):
        if loop.data.live is None and not loop.data.released:  # loaded or failed: position the new data there
            loop.data.source = data
            st.dataloader = loop.wrap_data(data)
        else:
            set_data(loop, data)
