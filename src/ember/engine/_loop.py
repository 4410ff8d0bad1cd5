"""The run loop: a generator that fires events in Ignite's order and suspends on interrupt.

The loop is written for speed. Deciding whether to fire costs one attribute test per event when an
event has no handlers; the requests of ``terminate``/``terminate_epoch``/``interrupt`` are folded into
one bool (`Signals.any`) checked after each event; nothing is formatted or logged per iteration.

Its state is in parts of their own: `Signals` (what handlers asked for), `Progress` (where the run stands in
its epochs), `DataPosition` (where it stands in its data), one `Dispatch` per event, and the `State` users read.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, Protocol

from ember.engine._dispatch import Dispatch
from ember.engine._events import EventEnum, Events
from ember.engine._position import DataPosition
from ember.engine._progress import Progress
from ember.engine._signals import Signals
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


class Driven(Protocol):
    """What the loop reads and sets on the engine that holds it: its state, the event fired last, its logger."""

    state: State
    last_event_name: Any
    logger: logging.Logger


class _Driving(threading.local):
    engines: list[Driven]  # the engines whose run is in progress on this thread's stack, outermost first

    def __init__(self) -> None:
        self.engines = []


_driving = _Driving()


def outermost() -> Driven | None:
    """The engine whose run, on this thread, the running runs were started from; ``None`` when none runs."""
    return _driving.engines[0] if _driving.engines else None


class Loop:
    """An engine's run: the generator that fires its events, and the parts it runs over.

    The engine holds one and passes itself: handlers and the process function receive the engine, whose ``state``
    and ``last_event_name`` the loop keeps. Its own parts: `Signals` (what handlers asked for), `Progress` (where the
    run stands in its epochs), `DataPosition` (where it stands in its data), and the registry's dispatch table.

    Examples:
        >>> from ember import Engine
        >>> engine = Engine(lambda engine, batch: batch)
        >>> _ = engine.run([1, 2]); engine.state.iteration
        2
    """

    gen: RunGen | None  # a run suspended by interrupt() or iterate()

    def __init__(
        self,
        engine: Driven,
        process_fn: Callable[[Any, Any], Any],
        dispatch: dict[Any, Dispatch],
        wrap_data: Callable[[Iterable[Any]], Iterable[Any]],
    ) -> None:
        self.engine = engine
        self.process_fn = process_fn
        self.wrap_data = wrap_data  # what the engine iterates for the data given (a trainer's puts it on device)
        self.dispatch = dispatch
        self.signals = Signals()  # what handlers asked for
        self.progress = Progress()  # where the run stands in its epochs
        self.data = DataPosition()  # the data as given, its live iterator, a position not yet live
        self.gen = None
        self.running = False

    def suspended(self) -> bool:
        """Whether a run is in progress: suspended by ``interrupt()`` or ``iterate()``, or running."""
        return self.gen is not None

    def drop_run(self) -> None:
        """Forget the run in progress (a new run starts, or a position was loaded)."""
        self.gen = None

    def start(self) -> None:
        """Make the run's generator, unless a run is in progress."""
        if self.gen is None:
            self.gen = self._run_gen()

    def reset_filters(self) -> None:
        """Every filter of every registration starts over (a new run, or a loaded position)."""
        for d in self.dispatch.values():
            d.due = -1
            for r in d.regs:
                if r.filter is not None:
                    r.filter.reset()

    def drive(self) -> Iterator[Signal]:
        """Advance the run, yielding each `PAUSE` and `INTERRUPT`; ``running`` is ``True`` while it advances."""
        engine = self.engine
        while self.gen is not None:
            self.running = True
            _driving.engines.append(engine)
            try:
                signal = next(self.gen)
            except StopIteration:
                self.gen = None
                return
            except BaseException:
                self.gen = None
                raise
            finally:
                self.running = False
                _driving.engines.pop()
            yield signal

    def _pause_point(self) -> RunGen:
        if self.signals.pause:
            self.signals.set_pause(False)
            yield PAUSE

    def _on_signal(self, event: EventEnum) -> RunGen:
        """Act on the requests the handlers of ``event`` made, after all of them have run."""
        signals = self.signals
        yield from self._pause_point()
        if signals.terminate:
            raise _Terminate
        if signals.terminate_epoch:
            if event in _NO_TERMINATE_EPOCH:
                signals.end_epoch_request()
                raise RuntimeError(
                    f"terminate_epoch() was called from a {event!r} handler, before the epoch has any "
                    "iteration to end; call it from an iteration or batch event, or call terminate()."
                )
            if event not in _EPOCH_ALREADY_ENDED:
                raise _TerminateEpoch
            signals.end_epoch_request()  # the epoch is over already
        if signals.interrupt:
            signals.set_interrupt(False)
            self._fire(Events.INTERRUPT, self.engine.state.iteration)
            yield INTERRUPT

    def _fire(self, event: EventEnum, value: int, *extra: Any) -> None:
        engine = self.engine
        engine.last_event_name = event
        d = self.dispatch[event]
        if d.regs:
            d.fire(engine, value, *extra)

    # -- the run ---------------------------------------------------------------------------------

    def _run_gen(self) -> RunGen:
        engine = self.engine
        st, signals, progress = engine.state, self.signals, self.progress
        signals.clear()
        progress.exhausted = False
        times: dict[str, float | None] = {"EPOCH_COMPLETED": None, "COMPLETED": None}
        st.times = times
        run_start = time.perf_counter()
        try:
            try:
                self._fire(Events.STARTED, st.epoch)
                if signals.any:
                    yield from self._on_signal(Events.STARTED)
                while not progress.exhausted and not progress.done(st):
                    epoch_start = time.perf_counter()
                    if not progress.epoch_open:
                        st.epoch += 1
                        progress.start_epoch()
                        self._fire(Events.EPOCH_STARTED, st.epoch)
                        if signals.any:
                            yield from self._on_signal(Events.EPOCH_STARTED)
                    completed = yield from self._run_epoch()
                    progress.epoch_open = False
                    times["EPOCH_COMPLETED"] = time.perf_counter() - epoch_start
                    if completed:
                        self._fire(Events.EPOCH_COMPLETED, st.epoch)
                        times["EPOCH_COMPLETED"] = time.perf_counter() - epoch_start
                        if signals.any:
                            yield from self._on_signal(Events.EPOCH_COMPLETED)
                    engine.logger.info("Epoch[%d] Complete. Time taken: %s", st.epoch, _hms(times["EPOCH_COMPLETED"]))
            except _Terminate:
                self._fire(Events.TERMINATE, st.epoch)
                yield from self._pause_point()
            times["COMPLETED"] = time.perf_counter() - run_start
            if signals.terminate != "skip_completed":
                self._fire(Events.COMPLETED, st.epoch)
                times["COMPLETED"] = time.perf_counter() - run_start
                yield from self._pause_point()
            engine.logger.info("Engine run finished. Time taken: %s", _hms(times["COMPLETED"]))
        except GeneratorExit:
            raise
        except BaseException as e:
            self.data.release(failed=True)
            if not getattr(e, "_ember_logged", False):  # an evaluator's run inside a trainer's: said once, by the first
                engine.logger.error("Engine run is terminating due to exception: %s", str(e) or type(e).__name__)
                with contextlib.suppress(AttributeError):  # an exception that takes no attributes is said again
                    e._ember_logged = True  # type: ignore[attr-defined]  # a mark on the exception object
            self._fire(Events.EXCEPTION_RAISED, st.iteration, e)
            raise

    def _run_epoch(self) -> Generator[Signal, None, bool]:
        """Run one epoch (or its rest); return whether EPOCH_COMPLETED should fire."""
        engine = self.engine
        st, signals, progress = engine.state, self.signals, self.progress
        d = self.dispatch
        gbs, gbc = d[Events.GET_BATCH_STARTED], d[Events.GET_BATCH_COMPLETED]
        its, itc = d[Events.ITERATION_STARTED], d[Events.ITERATION_COMPLETED]
        process = self.process_fn
        length = st.epoch_length
        if progress.completion_pending(st):
            return True  # continued after a terminate() at the epoch's last iteration
        data = self.data
        if data.live is None and st.dataloader is not None:
            data.open(st.dataloader, iteration=st.iteration, epoch=st.epoch, epoch_pos=progress.epoch_pos)
        pos = progress.epoch_pos
        try:
            while True:
                st.batch = None
                if data.live is not None:
                    engine.last_event_name = Events.GET_BATCH_STARTED
                    if gbs.regs:
                        gbs.fire(engine, st.iteration)
                    if signals.any:
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
                    engine.last_event_name = Events.GET_BATCH_COMPLETED
                    if gbc.regs:
                        gbc.fire(engine, st.iteration)
                    if signals.any:
                        yield from self._on_signal(Events.GET_BATCH_COMPLETED)
                else:
                    st.output = None
                pos += 1
                progress.epoch_pos = pos
                st.iteration += 1
                engine.last_event_name = Events.ITERATION_STARTED
                if its.regs:
                    its.fire(engine, st.iteration)
                if signals.any:
                    yield from self._on_signal(Events.ITERATION_STARTED)
                st.output = process(engine, st.batch)
                engine.last_event_name = Events.ITERATION_COMPLETED
                if itc.regs:
                    itc.fire(engine, st.iteration)
                if signals.any:
                    yield from self._on_signal(Events.ITERATION_COMPLETED)
                if pos == length:
                    return True
                if st.max_iters is not None and st.iteration >= st.max_iters:
                    # Ignite's way to end at max_iters (TERMINATE fires); the limit ended it, not a decision, so
                    # state_dict() says nothing of it
                    signals.set_terminate(True, final=False)
                    raise _Terminate
        except _TerminateEpoch:
            skip = signals.end_epoch_request()
            self._fire(Events.TERMINATE_SINGLE_EPOCH, st.epoch)
            if st.dataloader is not None:
                data.fresh_pass(st.dataloader, st.iteration)
            if signals.any:
                yield from self._on_signal(Events.TERMINATE_SINGLE_EPOCH)
            return not skip

    def _refetch(self, pos: int) -> Generator[Signal, None, bool]:
        """After the iterator ran out: put the next batch in ``state.batch`` or end the epoch (``False``)."""
        st = self.engine.state
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
                self.progress.exhausted = True
                return False
            self._fire(Events.DATALOADER_STOP_ITERATION, st.iteration)
            if self.signals.any:
                yield from self._on_signal(Events.DATALOADER_STOP_ITERATION)
            loader: Iterable[Any] = st.dataloader  # type: ignore[assignment]  # only called when there is data
            it = self.data.fresh_pass(loader, st.iteration)
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
