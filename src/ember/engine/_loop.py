"""The run loop: a generator that fires events in Ignite's order and suspends on interrupt.

The loop is written for speed. Deciding whether to fire costs one attribute test per event when an
event has no handlers; flags set by ``terminate``/``terminate_epoch``/``interrupt`` are folded into
one ``_signal`` bool checked after each event; nothing is formatted or logged per iteration.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Generator, Iterable
from typing import Any

from ember.engine._dispatch import Dispatch
from ember.engine._events import EventEnum, Events
from ember.engine._position import DataPosition
from ember.engine._state import State

#: What the run generator yields to its driver.
PAUSE = "pause"  # an ``iterate`` event fired: hand the state to the caller
INTERRUPT = "interrupt"  # ``interrupt()`` was called: return from ``run()``

Signal = str
RunGen = Generator[Signal, None, None]

_NO_TERMINATE_EPOCH = (Events.STARTED, Events.EPOCH_STARTED)
_EPOCH_ALREADY_ENDED = (Events.EPOCH_COMPLETED, Events.TERMINATE_SINGLE_EPOCH)


class _Terminate(Exception):
    """Raised inside the loop to end the run after ``terminate()``."""


class _TerminateEpoch(Exception):
    """Raised inside the loop to end the epoch after ``terminate_epoch()``."""


class RunLoop:
    """The engine's run loop; `Engine` adds the public API on top."""

    def __init__(self, process_fn: Callable[[Any, Any], Any]) -> None:
        self._process_fn = process_fn
        self.state = State()
        self.last_event_name: EventEnum | str | None = None
        self.logger = logging.getLogger(f"ember.engine._engine.{type(self).__name__}")
        self._terminate: bool | str = False
        self._terminate_epoch = False
        self._skip_epoch_completed = False
        self._interrupt = False
        self._pause = False
        self._signal = False
        self._dispatch: dict[EventEnum | str, Dispatch] = {e: Dispatch() for e in Events}
        self._gen: RunGen | None = None  # a run suspended by interrupt() or iterate()
        self._data = DataPosition()  # the data as given, its live iterator, a position not yet live
        self._epoch_open = False  # an epoch has started and not yet completed
        self._epoch_pos = 0  # iterations done in the current epoch
        self._exhausted = False
        self._epoch_owed = False  # mark_epoch_incomplete() was called in the last EPOCH_COMPLETED
        self._running = False
        self._loaded = False  # the position came from load_state_dict, and no run has started since
        self._stop_final = True  # the terminate() in effect ends the run for a relaunch too (False: Preemption's)

    def _reset_filters(self) -> None:
        for d in self._dispatch.values():
            d.due = -1
            for r in d.regs:
                if r.filter is not None:
                    r.filter.reset()

    # -- signals ---------------------------------------------------------------------------------

    @property
    def should_terminate(self) -> bool | str:
        """``True`` once ``terminate()`` was called (``"skip_completed"`` with ``skip_completed=True``), as Ignite.

        Setting it to ``True`` from a handler stops the run as ``terminate()`` does; it is cleared when a run starts.
        """
        return self._terminate

    @should_terminate.setter
    def should_terminate(self, value: bool | str) -> None:
        self._terminate = value
        self._stop_final = True
        self._update_signal()

    def _ended_by_decision(self) -> bool:
        """The run was stopped by a final ``terminate()``: a run loaded from its state is complete."""
        return bool(self._terminate) and self._stop_final

    @property
    def should_terminate_single_epoch(self) -> bool | str:
        """``True`` once ``terminate_epoch()`` was called (``"skip_epoch_completed"`` when it skips EPOCH_COMPLETED).

        Setting it from a handler ends the epoch as ``terminate_epoch()`` does; it is cleared once the epoch ends.
        """
        return "skip_epoch_completed" if self._skip_epoch_completed else self._terminate_epoch

    @should_terminate_single_epoch.setter
    def should_terminate_single_epoch(self, value: bool | str) -> None:
        self._terminate_epoch = bool(value)
        self._skip_epoch_completed = value == "skip_epoch_completed"
        self._update_signal()

    def _update_signal(self) -> None:
        self._signal = bool(self._terminate or self._terminate_epoch or self._interrupt or self._pause)

    def _clear_signals(self) -> None:
        self._terminate, self._stop_final = False, True
        self._terminate_epoch = self._skip_epoch_completed = False
        self._interrupt = self._pause = self._signal = False

    def _pause_point(self) -> RunGen:
        if self._pause:
            self._pause = False
            self._update_signal()
            yield PAUSE

    def _on_signal(self, event: EventEnum) -> RunGen:
        """Act on flags set by the handlers of ``event``, after all of them have run."""
        yield from self._pause_point()
        if self._terminate:
            raise _Terminate
        if self._terminate_epoch:
            if event in _NO_TERMINATE_EPOCH:
                self._terminate_epoch = self._skip_epoch_completed = False
                self._update_signal()
                raise RuntimeError(
                    f"terminate_epoch() was called from a {event!r} handler, before the epoch has any "
                    "iteration to end; call it from an iteration or batch event, or call terminate()."
                )
            if event not in _EPOCH_ALREADY_ENDED:
                raise _TerminateEpoch
            self._terminate_epoch = self._skip_epoch_completed = False  # the epoch is over already
            self._update_signal()
        if self._interrupt:
            self._interrupt = False
            self._update_signal()
            self._fire(Events.INTERRUPT, self.state.iteration)
            yield INTERRUPT

    def _fire(self, event: EventEnum, value: int, *extra: Any) -> None:
        self.last_event_name = event
        d = self._dispatch[event]
        if d.regs:
            d.fire(self, value, *extra)

    # -- the run ---------------------------------------------------------------------------------

    def _epoch_completion_pending(self) -> bool:
        """The current epoch's last iteration ran, but a terminate() kept EPOCH_COMPLETED from firing."""
        length = self.state.epoch_length
        return self._epoch_open and length is not None and self._epoch_pos >= length

    def _is_done(self) -> bool:
        st = self.state
        if st.max_iters is not None and st.iteration >= st.max_iters:
            return True
        if st.max_epochs is None:
            return False
        if st.epoch - self._epoch_open >= st.max_epochs:
            return True
        if self._epoch_completion_pending():
            return False  # the epoch still owes its EPOCH_COMPLETED
        return st.epoch_length is not None and st.iteration >= st.epoch_length * st.max_epochs

    def _run_gen(self) -> RunGen:
        st = self.state
        self._clear_signals()
        self._exhausted = False
        st.times = {"EPOCH_COMPLETED": None, "COMPLETED": None}
        run_start = time.perf_counter()
        try:
            try:
                self._fire(Events.STARTED, st.epoch)
                if self._signal:
                    yield from self._on_signal(Events.STARTED)
                while not self._exhausted and not self._is_done():
                    epoch_start = time.perf_counter()
                    if not self._epoch_open:
                        st.epoch += 1
                        self._epoch_open = True
                        self._epoch_owed = False
                        self._epoch_pos = 0
                        self._fire(Events.EPOCH_STARTED, st.epoch)
                        if self._signal:
                            yield from self._on_signal(Events.EPOCH_STARTED)
                    completed = yield from self._run_epoch()
                    self._epoch_open = False
                    st.times["EPOCH_COMPLETED"] = time.perf_counter() - epoch_start
                    if completed:
                        self._fire(Events.EPOCH_COMPLETED, st.epoch)
                        st.times["EPOCH_COMPLETED"] = time.perf_counter() - epoch_start
                        if self._signal:
                            yield from self._on_signal(Events.EPOCH_COMPLETED)
                    self.logger.info("Epoch[%d] Complete. Time taken: %s", st.epoch, _hms(st.times["EPOCH_COMPLETED"]))
            except _Terminate:
                self._fire(Events.TERMINATE, st.epoch)
                yield from self._pause_point()
            st.times["COMPLETED"] = time.perf_counter() - run_start
            if self._terminate != "skip_completed":
                self._fire(Events.COMPLETED, st.epoch)
                st.times["COMPLETED"] = time.perf_counter() - run_start
                yield from self._pause_point()
            self.logger.info("Engine run finished. Time taken: %s", _hms(st.times["COMPLETED"]))
        except GeneratorExit:
            raise
        except BaseException as e:
            self._data.release(failed=True)
            self.logger.error("Engine run is terminating due to exception: %s", e)
            self._fire(Events.EXCEPTION_RAISED, st.iteration, e)
            raise

    def _run_epoch(self) -> Generator[Signal, None, bool]:
        """Run one epoch (or its rest); return whether EPOCH_COMPLETED should fire."""
        st = self.state
        d = self._dispatch
        gbs, gbc = d[Events.GET_BATCH_STARTED], d[Events.GET_BATCH_COMPLETED]
        its, itc = d[Events.ITERATION_STARTED], d[Events.ITERATION_COMPLETED]
        process = self._process_fn
        length = st.epoch_length
        if self._epoch_completion_pending():
            return True  # continued after a terminate() at the epoch's last iteration
        data = self._data
        if data.live is None and st.dataloader is not None:
            data.open(st.dataloader, iteration=st.iteration, epoch=st.epoch, epoch_pos=self._epoch_pos)
        pos = self._epoch_pos
        try:
            while True:
                st.batch = None
                if data.live is not None:
                    self.last_event_name = Events.GET_BATCH_STARTED
                    if gbs.regs:
                        gbs.fire(self, st.iteration)
                    if self._signal:
                        yield from self._on_signal(Events.GET_BATCH_STARTED)
                    try:
                        st.batch = next(data.live)
                    except StopIteration:
                        fetched = yield from self._refetch(pos)
                        if not fetched:
                            return True
                    except Exception as e:
                        e.add_note(f"(raised by the data, fetching the batch of iteration {st.iteration + 1})")
                        raise
                    st.output = None  # only once a batch came: the epoch's last output outlives the data's end
                    self.last_event_name = Events.GET_BATCH_COMPLETED
                    if gbc.regs:
                        gbc.fire(self, st.iteration)
                    if self._signal:
                        yield from self._on_signal(Events.GET_BATCH_COMPLETED)
                else:
                    st.output = None
                pos += 1
                self._epoch_pos = pos
                st.iteration += 1
                self.last_event_name = Events.ITERATION_STARTED
                if its.regs:
                    its.fire(self, st.iteration)
                if self._signal:
                    yield from self._on_signal(Events.ITERATION_STARTED)
                st.output = process(self, st.batch)
                self.last_event_name = Events.ITERATION_COMPLETED
                if itc.regs:
                    itc.fire(self, st.iteration)
                if self._signal:
                    yield from self._on_signal(Events.ITERATION_COMPLETED)
                if pos == length:
                    return True
                if st.max_iters is not None and st.iteration >= st.max_iters:
                    self.should_terminate = True  # Ignite's way to end at max_iters (TERMINATE fires)
                    self._stop_final = False  # the limit ended it, not a decision: state_dict() says nothing
                    raise _Terminate
        except _TerminateEpoch:
            skip = self._skip_epoch_completed
            self._terminate_epoch = self._skip_epoch_completed = False
            self._update_signal()
            self._fire(Events.TERMINATE_SINGLE_EPOCH, st.epoch)
            if st.dataloader is not None:
                self._data.fresh_pass(st.dataloader, st.iteration)
            if self._signal:
                yield from self._on_signal(Events.TERMINATE_SINGLE_EPOCH)
            return not skip

    def _refetch(self, pos: int) -> Generator[Signal, None, bool]:
        """After the iterator ran out: put the next batch in ``state.batch`` or end the epoch (``False``)."""
        st = self.state
        restarted = False
        while True:
            if st.epoch_length is None:  # data of unknown length: this was the end of the first epoch
                if pos == 0:
                    raise ValueError("`data` produced no batches; pass data with at least one batch.")
                st.epoch_length = pos
                return False
            if restarted:
                total = st.max_iters if st.max_iters is not None else st.epoch_length * (st.max_epochs or 0)
                warnings.warn(
                    f"The data ran out at iteration {st.iteration} of {total}, in epoch {st.epoch}; the run "
                    "stops here. Pass data that can be iterated again (a list, or an object whose __iter__ "
                    "starts over), or ask for fewer iterations.",
                    UserWarning,
                    stacklevel=2,
                )
                self._exhausted = True
                return False
            self._fire(Events.DATALOADER_STOP_ITERATION, st.iteration)
            if self._signal:
                yield from self._on_signal(Events.DATALOADER_STOP_ITERATION)
            loader: Iterable[Any] = st.dataloader  # type: ignore[assignment]  # only called when there is data
            it = self._data.fresh_pass(loader, st.iteration)
            restarted = True
            try:
                st.batch = next(it)
                return True
            except StopIteration:
                pass


def _hms(seconds: float | None) -> str:
    """``seconds`` as Ignite's logs write a duration: ``00:01:02.345``."""
    mins, secs = divmod(seconds or 0.0, 60)
    hours, mins = divmod(mins, 60)
    return f"{round(hours):02d}:{round(mins):02d}:{secs:06.3f}"
