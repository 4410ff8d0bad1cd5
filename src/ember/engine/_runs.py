"""`RunSetup`: what ``run()`` does before the loop starts: start a new run, continue one, or switch data."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from ember.engine._position import DataPosition
from ember.engine._progress import Progress
from ember.engine._signals import Signals
from ember.engine._state import State
from ember.engine._validate import (
    already_complete,
    check_mode,
    check_run_args,
    data_length,
    ended_by_terminate,
    restart_hint,
    same_data,
)


class RunSetup:
    """Reconciles ``run()``'s arguments with the run in progress: start a new run, continue one, or switch data.

    It has no state of its own: it sets up the run loop's parts (`RunLoop`) for the generator that runs.
    """

    # the run loop's parts and steps (`RunLoop`)
    state: State
    logger: logging.Logger
    _signals: Signals
    _progress: Progress
    _data: DataPosition
    _running: bool
    _reset_filters: Callable[[], None]
    _suspended: Callable[[], bool]
    _drop_run: Callable[[], None]
    _start_gen: Callable[[], None]

    def _wrap_data(self, data: Iterable[Any]) -> Iterable[Any]:
        """Hook for subclasses: what the engine iterates for ``data`` (a trainer puts it on device)."""
        return data

    def set_data(self, data: Iterable[Any]) -> None:
        """Switch the data source: the next batch comes from the start of ``data``.

        The epoch length is not changed.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: print(batch, end=" "))
            >>> _ = engine.add_event_handler(Events.ITERATION_COMPLETED(once=2), lambda e: e.set_data("xyz"))
            >>> _ = engine.run("abc", max_epochs=2)
            a b x y z x
        """
        if not isinstance(data, Iterable):
            raise TypeError(f"`data` must be an iterable of batches, got {type(data).__name__}.")
        self._data.release()
        self.state.dataloader = self._wrap_data(data)
        self._data.start(data, self.state.dataloader)

    def _prepare_run(
        self,
        data: Iterable[Any] | None,
        max_epochs: int | None = None,
        max_iters: int | None = None,
        epoch_length: int | None = None,
    ) -> bool:
        """Set up the run ``run()`` asked for; ``False`` when there is nothing to run (a finished run was loaded)."""
        if self._running:
            raise RuntimeError(
                "run() was called while this engine is running (from a handler or the process function); "
                "use a second Engine, or call terminate()/interrupt() instead."
            )
        check_run_args(data, max_epochs, max_iters, epoch_length)
        st = self.state
        check_mode(st, max_epochs, max_iters)
        if st.max_epochs is not None or st.max_iters is not None:  # a run exists: apply what the caller changes
            self._update_limits(max_epochs, max_iters, epoch_length)
        progress = self._progress
        if progress.loaded and self._signals.terminate:  # loaded from a run a handler ended (early stopping, ...)
            warnings.warn(ended_by_terminate(st), UserWarning, stacklevel=3)
            return False
        if st.max_epochs is None and st.max_iters is None:
            self._start_new_run(data, max_epochs, max_iters, epoch_length)
        elif not self._suspended() and progress.done(st):
            if progress.loaded:
                warnings.warn(already_complete(st), UserWarning, stacklevel=3)
                return False
            self._start_new_run(data, max_epochs, max_iters, epoch_length)
        else:
            self._continue_run(data)
            self._log_resume()
        progress.loaded = False
        self._start_gen()
        return True

    def _log_resume(self) -> None:
        st = self.state
        until = f"{st.max_iters} iterations" if st.max_iters is not None else f"{st.max_epochs} epochs"
        self.logger.info("Engine run resuming from iteration %d, epoch %d until %s", st.iteration, st.epoch, until)

    def _start_new_run(
        self,
        data: Iterable[Any] | None,
        max_epochs: int | None,
        max_iters: int | None,
        epoch_length: int | None,
    ) -> None:
        st = self.state
        if epoch_length is None:
            if data is None:
                raise ValueError("`epoch_length` is required when `data` is None: the engine cannot count batches.")
            epoch_length = data_length(data)
        if max_iters is None and max_epochs is None:
            max_epochs = 1
        st.iteration = st.epoch = 0
        st.max_epochs, st.max_iters, st.epoch_length = max_epochs, max_iters, epoch_length
        self._data.release()
        st.dataloader = None if data is None else self._wrap_data(data)
        self._data.start(data)
        self._drop_run()
        self._progress.restart()
        self._reset_filters()
        limit = f"max_iters={max_iters}" if max_iters is not None else f"max_epochs={max_epochs}"
        self.logger.info("Engine run starting with %s.", limit)

    def _update_limits(self, max_epochs: int | None, max_iters: int | None, epoch_length: int | None) -> None:
        st = self.state
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

    def _continue_run(self, data: Iterable[Any] | None) -> None:
        st = self.state
        if data is None and st.dataloader is None and st.epoch_length is None:
            raise ValueError("`epoch_length` is required when `data` is None: the engine cannot count batches.")
        if data is not None and not same_data(data, self._data.source):
            if self._data.live is None and not self._data.released:  # loaded or failed: position the new data there
                self._data.source = data
                st.dataloader = self._wrap_data(data)
            else:
                self.set_data(data)
