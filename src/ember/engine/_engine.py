"""`Engine`: runs a process function over data and fires events to registered handlers."""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ember.engine._dispatch import Dispatch, Registration, RemovableEventHandle, check_handler
from ember.engine._events import EventEnum, Events, EventsList, FilteredEvent, base_event
from ember.engine._loop import INTERRUPT, PAUSE, RunLoop
from ember.engine._resume import AttachedStates, engine_state_dict, load_engine_state
from ember.engine._state import State
from ember.engine._validate import check_run_args

ProcessFn = Callable[["Engine", Any], Any]

# The counter each built-in event's filters see.
_EVENT_TO_ATTR: dict[EventEnum | str, str] = {
    Events.STARTED: "epoch",
    Events.EPOCH_STARTED: "epoch",
    Events.EPOCH_COMPLETED: "epoch",
    Events.TERMINATE_SINGLE_EPOCH: "epoch",
    Events.TERMINATE: "epoch",
    Events.COMPLETED: "epoch",
    Events.GET_BATCH_STARTED: "iteration",
    Events.GET_BATCH_COMPLETED: "iteration",
    Events.DATALOADER_STOP_ITERATION: "iteration",
    Events.ITERATION_STARTED: "iteration",
    Events.ITERATION_COMPLETED: "iteration",
    Events.INTERRUPT: "iteration",
    Events.EXCEPTION_RAISED: "iteration",
}


class Engine(RunLoop):
    """Runs ``process_fn(engine, batch)`` over data, firing :class:`Events` to registered handlers.

    The engine owns the loop and the counters (Python ints in :attr:`state`); the process function
    owns the work. Handlers attach with :meth:`on` or :meth:`add_event_handler`, optionally filtered
    (``Events.ITERATION_COMPLETED(every=25)``), and run in registration order. The event order,
    termination, resumption and ``state_dict`` follow PyTorch Ignite; ``docs/concepts/events.md`` lists
    where ember deliberately differs.

    Args:
        process_fn: ``process_fn(engine, batch) -> output``; ``output`` lands in ``state.output``.

    Attributes:
        state: the run's :class:`State`.
        last_event_name: the event fired last.
        should_terminate: ``True`` once :meth:`terminate` was called, until the next run starts.

    Examples:
        >>> from ember import Engine, Events
        >>> trainer = Engine(lambda engine, batch: sum(batch))
        >>> @trainer.on(Events.EPOCH_COMPLETED)
        ... def report(engine):
        ...     print(f"epoch {engine.state.epoch}: last output {engine.state.output}")
        >>> state = trainer.run([[1, 2], [3, 4]], max_epochs=2)
        epoch 1: last output 7
        epoch 2: last output 7
        >>> state.iteration
        4
    """

    def __init__(self, process_fn: ProcessFn) -> None:
        if not callable(process_fn):
            raise TypeError(f"`process_fn` must be callable as process_fn(engine, batch), got {process_fn!r}.")
        try:
            inspect.signature(process_fn).bind(None, None)
        except TypeError:
            raise TypeError(
                f"`process_fn` must accept (engine, batch); {getattr(process_fn, '__qualname__', process_fn)}"
                f"{inspect.signature(process_fn)} does not."
            ) from None
        except ValueError:  # no signature to inspect: trust it
            pass
        super().__init__(process_fn)
        self._event_to_attr: dict[EventEnum | str, str] = dict(_EVENT_TO_ATTR)
        self._state_dict_user_keys: list[str] = []
        self._running = False
        self._loaded = False  # the position came from load_state_dict, and no run has started since
        self._epoch_owed = False  # mark_epoch_incomplete() was called in the last EPOCH_COMPLETED
        self._states = AttachedStates()

    def _wrap_data(self, data: Iterable[Any]) -> Iterable[Any]:
        """Hook for subclasses: what the engine iterates for ``data`` (a trainer puts it on device)."""
        return data

    def fuse_step_update(
        self,
        update: Any,
        reset: Any = None,
        compute: Any = None,
        *,
        per_step: bool = False,
        names: Sequence[str] = (),
    ) -> Callable[[], None] | None:
        """Offer an update to be folded into the engine's compiled step; return how to take it out again.

        A plain engine has no compiled step and returns ``None``: the caller then registers an ordinary
        ITERATION_COMPLETED handler. A training engine folds the update of a metric into its compiled
        call, so updating costs no extra device dispatch. ``reset`` and ``compute`` name the events at which
        the update's owner resets and reads it, so an engine can refuse what it cannot fold faithfully;
        ``per_step`` says the update publishes its value for every step (a running average), so it can be
        read at every iteration even when one call runs several steps, and ``names`` are the entries of
        ``state.metrics`` it goes in. Metrics call this; users rarely need it.

        Examples:
            >>> from ember import Engine
            >>> Engine(lambda engine, batch: batch).fuse_step_update(object()) is None
            True
        """
        return None

    def track_state(self, name: str, obj: Any) -> Callable[[], None]:
        """Save ``obj.state_dict()`` inside this engine's :meth:`state_dict`, and restore it with it.

        Metrics attached to an engine call this, so a checkpoint of the engine carries their
        accumulators and a resumed run computes exactly the values an uninterrupted one would. A state
        loaded before ``obj`` is tracked is given to it when it is. Returns how to stop tracking.

        Examples:
            >>> from ember import Engine
            >>> class Counter:
            ...     n = 0
            ...     def state_dict(self): return {"n": self.n}
            ...     def load_state_dict(self, sd): self.n = sd["n"]
            >>> engine, counter = Engine(lambda e, b: None), Counter()
            >>> _ = engine.track_state("counter", counter)
            >>> counter.n = 3
            >>> engine.state_dict()["attached"]
            {'counter': {'n': 3}}
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"`name` must be a non-empty string, got {name!r}.")
        return self._states.add(name, obj)

    # -- handlers --------------------------------------------------------------------------------

    def register_events(
        self, *events: EventEnum | str, event_to_attr: Mapping[EventEnum | str, str] | None = None
    ) -> None:
        """Allow custom events to be fired and handled on this engine.

        Args:
            *events: :class:`EventEnum` members or plain strings.
            event_to_attr: for events that take filters, the name of the ``state`` counter the filter
                reads; the counter is created (at 0) on this engine's state. The mapping belongs to this
                engine only.

        Raises:
            TypeError: an event is neither an ``EventEnum`` member nor a string.
            ValueError: ``event_to_attr`` names an event not being registered.

        Examples:
            >>> from ember import Engine, EventEnum
            >>> class TBPTT(EventEnum):
            ...     TIME_ITERATION_COMPLETED = "time_iteration_completed"
            >>> engine = Engine(lambda engine, batch: None)
            >>> engine.register_events(*TBPTT, event_to_attr={TBPTT.TIME_ITERATION_COMPLETED: "time_iteration"})
            >>> engine.state.time_iteration
            0
        """
        for e in events:
            if not isinstance(e, EventEnum | str):
                raise TypeError(f"register_events takes EventEnum members or strings, got {type(e).__name__} {e!r}.")
            self._dispatch.setdefault(e, Dispatch())
        for e, attr in (event_to_attr or {}).items():
            if e not in self._dispatch:
                raise ValueError(f"`event_to_attr` maps {e!r}, which is not registered; pass it in `events` too.")
            if not isinstance(attr, str) or not attr.isidentifier():
                raise TypeError(f"`event_to_attr` values must be attribute names, got {attr!r} for {e!r}.")
            self._event_to_attr[e] = attr
            if not hasattr(self.state, attr):
                setattr(self.state, attr, 0)

    def _dispatch_of(self, event: EventEnum | str) -> Dispatch:
        try:
            return self._dispatch[event]
        except KeyError:
            raise ValueError(
                f"{event!r} is not an event of this engine; register it with engine.register_events({event!r})."
            ) from None
        except TypeError:
            raise TypeError(
                f"Expected an event (Events.X, Events.X(...), or a registered name), got {event!r}."
            ) from None

    def add_event_handler(
        self,
        event: EventEnum | FilteredEvent | EventsList | str,
        handler: Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> RemovableEventHandle:
        """Register ``handler`` to run when ``event`` fires; return a handle that removes it.

        The handler is called as ``handler(engine, *args, **kwargs)``, or ``handler(*args, **kwargs)``
        if it does not take the engine; on ``EXCEPTION_RAISED`` the exception comes right after the
        engine. Handlers of one event run in registration order. An :class:`EventsList` registers the
        handler once per element.

        Args:
            event: the event, possibly filtered, or an ``EventsList``.
            handler: the callable to run.
            *args: extra positional arguments for the handler.
            **kwargs: extra keyword arguments for the handler.

        Returns:
            A :class:`RemovableEventHandle`.

        Raises:
            ValueError: the event is not registered, or is filtered but has no counter.
            TypeError: the handler cannot be called with what the engine will pass.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> handle = engine.add_event_handler(Events.COMPLETED, print, "done")
            >>> _ = engine.run([1])
            <ember.engine._engine.Engine object at ...> done
            >>> handle.remove()
        """
        return self._register(event, handler, args, kwargs, priority=False)

    def add_priority_handler(
        self,
        event: EventEnum | FilteredEvent | EventsList | str,
        handler: Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> RemovableEventHandle:
        """Like :meth:`add_event_handler`, but the handler runs before the event's ordinary handlers.

        Priority handlers run among themselves in registration order. Metrics use this, so a logger
        attached before a metric still sees the metric's fresh value.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> order = []
            >>> _ = engine.add_event_handler(Events.COMPLETED, lambda: order.append("logger"))
            >>> _ = engine.add_priority_handler(Events.COMPLETED, lambda: order.append("metric"))
            >>> _ = engine.run([1])
            >>> order
            ['metric', 'logger']
        """
        return self._register(event, handler, args, kwargs, priority=True)

    def _register(
        self,
        event: EventEnum | FilteredEvent | EventsList | str,
        handler: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        priority: bool,
    ) -> RemovableEventHandle:
        events = list(event) if isinstance(event, EventsList) else [event]
        checked = [self._check_registration(e, handler, args, kwargs) for e in events]
        regs: list[Registration] = []
        for e, takes_engine in checked:
            base = base_event(e)
            filt = e.filter.bind() if isinstance(e, FilteredEvent) else None
            reg = Registration(base, handler, filt, args, kwargs, takes_engine)
            reg.priority = priority
            self._dispatch[base].add(reg)
            regs.append(reg)
        return RemovableEventHandle(event, handler, self, regs)

    def _check_registration(
        self, event: object, handler: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[EventEnum | FilteredEvent | str, bool]:
        if not isinstance(event, EventEnum | FilteredEvent | str):
            raise TypeError(f"Expected an event (Events.X, Events.X(...), or a registered name), got {event!r}.")
        base = base_event(event)
        self._dispatch_of(base)
        if isinstance(event, FilteredEvent) and base not in self._event_to_attr:
            raise ValueError(
                f"{event!r} has a filter but {base!r} has no counter to filter on; register it with "
                f"event_to_attr={{{base!r}: 'name'}}."
            )
        event_args = (Exception(),) if base is Events.EXCEPTION_RAISED else ()
        return event, check_handler(handler, event, event_args, args, kwargs)

    def on(self, event: EventEnum | FilteredEvent | EventsList | str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        """Decorator form of :meth:`add_event_handler`; returns the function unchanged.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> @engine.on(Events.EPOCH_STARTED(once=2))
            ... def second_epoch(engine):
            ...     print("epoch", engine.state.epoch)
            >>> _ = engine.run([1], max_epochs=3)
            epoch 2
        """

        def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add_event_handler(event, fn, *args, **kwargs)
            return fn

        return decorator

    def has_event_handler(
        self, handler: Callable[..., Any], event: EventEnum | FilteredEvent | str | None = None
    ) -> bool:
        """Whether ``handler`` is registered on ``event`` (with any filter), or on any event if ``None``.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> _ = engine.add_event_handler(Events.ITERATION_COMPLETED(every=10), print)
            >>> engine.has_event_handler(print, Events.ITERATION_COMPLETED)
            True
            >>> engine.has_event_handler(print, Events.EPOCH_COMPLETED)
            False
        """
        if event is None:
            dispatches: Iterable[Dispatch] = self._dispatch.values()
        else:
            d = self._dispatch.get(base_event(event))
            dispatches = [d] if d is not None else []
        return any(r.handler == handler for d in dispatches for r in d.regs)

    def remove_event_handler(self, handler: Callable[..., Any], event: EventEnum | FilteredEvent | str) -> None:
        """Remove every registration of ``handler`` on ``event``, whatever filters they had.

        Raises:
            ValueError: the event is not registered, or the handler is not registered on it.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> _ = engine.add_event_handler(Events.COMPLETED, print)
            >>> engine.remove_event_handler(print, Events.COMPLETED)
            >>> engine.has_event_handler(print)
            False
        """
        d = self._dispatch_of(base_event(event))
        found = [r for r in d.regs if r.handler == handler]
        if not found:
            raise ValueError(f"Handler {handler!r} is not registered on {event!r}.")
        for r in found:
            d.remove(r)

    def fire_event(self, event: EventEnum | str) -> None:
        """Run the handlers of a registered event now; custom events are fired this way.

        Raises:
            ValueError: the event is not registered on this engine.
            TypeError: a filtered event was given; fire its base event.

        Examples:
            >>> from ember import Engine
            >>> engine = Engine(lambda engine, batch: None)
            >>> engine.register_events("checkpoint_saved")
            >>> _ = engine.add_event_handler("checkpoint_saved", lambda: print("saved"))
            >>> engine.fire_event("checkpoint_saved")
            saved
        """
        if isinstance(event, FilteredEvent):
            raise TypeError(f"fire_event takes the base event, not a filtered one: use {event.event!r}.")
        d = self._dispatch_of(event)
        attr = self._event_to_attr.get(event)
        self.last_event_name = event
        if d.regs:
            d.fire(self, getattr(self.state, attr) if attr else 0)

    # -- control ---------------------------------------------------------------------------------

    def terminate(self, skip_completed: bool = False) -> None:
        """Stop the run once the current event's handlers have run; TERMINATE then COMPLETED fire.

        A later :meth:`run` continues from the next iteration, so no batch is skipped or repeated.

        Args:
            skip_completed: do not fire COMPLETED after TERMINATE.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> _ = engine.add_event_handler(Events.ITERATION_COMPLETED(once=13), lambda e: e.terminate())
            >>> engine.run(range(10), max_epochs=5).iteration
            13
            >>> engine.run().iteration
            50
        """
        self.should_terminate = True
        self._skip_completed = bool(skip_completed)
        self._signal = True

    def terminate_epoch(self, skip_epoch_completed: bool = False) -> None:
        """End the current epoch once the current event's handlers have run; the next epoch follows.

        TERMINATE_SINGLE_EPOCH fires, then EPOCH_COMPLETED (unless skipped). Called from STARTED or
        EPOCH_STARTED it makes :meth:`run` raise ``RuntimeError``; from EPOCH_COMPLETED it does nothing.

        Args:
            skip_epoch_completed: do not fire EPOCH_COMPLETED for the ended epoch.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> _ = engine.add_event_handler(Events.ITERATION_COMPLETED(every=2), lambda e: e.terminate_epoch())
            >>> engine.run(range(10), max_epochs=3).iteration
            6
        """
        self._terminate_epoch = True
        self._skip_epoch_completed = bool(skip_epoch_completed)
        self._signal = True

    def interrupt(self) -> None:
        """Return from :meth:`run` once the current event's handlers have run; INTERRUPT fires.

        The next :meth:`run` resumes exactly there, with the same data iterator and no second STARTED.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> _ = engine.add_event_handler(Events.ITERATION_COMPLETED(every=4), lambda e: e.interrupt())
            >>> engine.run(range(3), max_epochs=3).iteration
            4
            >>> engine.run().iteration
            8
            >>> engine.run().iteration
            9
        """
        self._interrupt = True
        self._signal = True

    def _request_pause(self) -> None:
        self._pause = True
        self._signal = True

    # -- running ---------------------------------------------------------------------------------

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
        self._source = data
        self.state.dataloader = self._wrap_data(data)
        self._iter = iter(self.state.dataloader)
        self._data_state = None

    def run(
        self,
        data: Iterable[Any] | None = None,
        max_epochs: int | None = None,
        max_iters: int | None = None,
        epoch_length: int | None = None,
    ) -> State:
        """Run, or continue, over ``data``; return the state.

        A new run starts at iteration 0 when the engine has never run, when its last run finished, or
        when ``state.max_epochs`` was set to ``None``. Otherwise (after :meth:`terminate`,
        :meth:`interrupt`, an exception, or :meth:`load_state_dict`) the run continues where it
        stopped, and a larger ``max_epochs`` extends it. A run loaded by :meth:`load_state_dict` that is
        already complete stays complete: ``run()`` fires nothing and warns, unless ``max_epochs`` (or
        ``max_iters``) asks for more; so relaunching a finished job never trains it again.

        Args:
            data: an iterable of batches, or ``None`` to call the process function with ``None``
                (``epoch_length`` is then required). Data with ``state_dict``/``load_state_dict``
                saves and restores its own position with the engine's.
            max_epochs: epochs to run (default 1 for a new run).
            max_iters: iterations to run, instead of ``max_epochs``.
            epoch_length: iterations per epoch (default ``len(data)``, or learned at the end of the
                first epoch for data without a length).

        Returns:
            The engine's :class:`State`.

        Raises:
            TypeError: ``data`` is not iterable, or an argument has the wrong type.
            ValueError: conflicting or out-of-range arguments, or empty data.
            RuntimeError: called from inside this engine's own run.

        Examples:
            >>> from ember import Engine
            >>> engine = Engine(lambda engine, batch: batch)
            >>> engine.run([1, 2, 3], max_epochs=2).iteration
            6
            >>> engine.run([1, 2, 3], max_epochs=3).iteration  # continues: one more epoch
            9
        """
        if not self._prepare_run(data, max_epochs, max_iters, epoch_length):
            return self.state
        for signal in self._drive():
            if signal is INTERRUPT:
                break
        return self.state

    def iterate(
        self, data: Iterable[Any] | None, event: EventEnum | FilteredEvent, **run_kwargs: Any
    ) -> Iterator[State]:
        """Run as a generator that yields the state each time ``event`` fires.

        All handlers of the event have run when the state is yielded. Leaving the loop early leaves the
        engine resumable, as after :meth:`interrupt`: the next ``run()`` or ``iterate()`` continues.

        Args:
            data: as for :meth:`run`.
            event: the event to yield on, usually filtered.
            **run_kwargs: ``max_epochs``, ``max_iters`` or ``epoch_length``, as for :meth:`run`.

        Yields:
            The engine's :class:`State`.

        Examples:
            >>> from ember import Engine, Events
            >>> trainer = Engine(lambda engine, batch: batch * 10)
            >>> for state in trainer.iterate(range(4), Events.ITERATION_COMPLETED(every=3), max_epochs=2):
            ...     print(state.epoch, state.iteration, state.output)
            1 3 20
            2 6 10
        """
        unknown = set(run_kwargs) - {"max_epochs", "max_iters", "epoch_length"}
        if unknown:
            raise TypeError(f"iterate() got unexpected arguments {sorted(unknown)}; it takes those of run().")
        self._check_registration(event, self._request_pause, (), {})
        if not self._prepare_run(data, **run_kwargs):
            return iter(())
        handle = self.add_event_handler(event, self._request_pause)
        return self._iterate(handle)

    def _iterate(self, handle: RemovableEventHandle) -> Iterator[State]:
        try:
            for signal in self._drive():
                if signal is PAUSE:
                    yield self.state
                elif signal is INTERRUPT:
                    return
        finally:
            handle.remove()

    def _drive(self) -> Iterator[str]:
        while self._gen is not None:
            self._running = True
            try:
                signal = next(self._gen)
            except StopIteration:
                self._gen = None
                return
            except BaseException:
                self._gen = None
                raise
            finally:
                self._running = False
            yield signal

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
        undetermined = st.max_iters is not None and st.epoch_length is None
        if st.max_epochs is not None or undetermined:  # a run exists: apply what the caller changes first
            self._update_limits(max_epochs, max_iters, epoch_length)
        if st.max_epochs is None and not undetermined:
            self._start_new_run(data, max_epochs, max_iters, epoch_length)
        elif self._gen is None and self._is_done():
            if self._loaded:
                warnings.warn(_already_complete(st), UserWarning, stacklevel=3)
                return False
            self._start_new_run(data, max_epochs, max_iters, epoch_length)
        else:
            self._continue_run(data)
        self._loaded = False
        if self._gen is None:
            self._gen = self._run_gen()
        return True

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
            epoch_length = _data_length(data)
        if max_iters is None and max_epochs is None:
            max_epochs = 1
        if max_iters is not None and epoch_length is not None:
            max_epochs = math.ceil(max_iters / epoch_length)
        st.iteration = st.epoch = 0
        st.max_epochs, st.max_iters, st.epoch_length = max_epochs, max_iters, epoch_length
        self._epoch_owed = False
        self._source = data
        st.dataloader = None if data is None else self._wrap_data(data)
        self._gen = self._iter = self._data_state = None
        self._epoch_open, self._epoch_pos = False, 0
        self._reset_filters()

    def _update_limits(self, max_epochs: int | None, max_iters: int | None, epoch_length: int | None) -> None:
        st = self.state
        if max_epochs is not None:
            if max_epochs < st.epoch:
                raise ValueError(
                    f"`max_epochs`={max_epochs} is below the epoch this engine reached ({st.epoch}); pass a "
                    "larger value to continue, or set engine.state.max_epochs = None to restart from zero."
                )
            st.max_epochs, st.max_iters = max_epochs, None
        if max_iters is not None:
            if max_iters < st.iteration:
                raise ValueError(
                    f"`max_iters`={max_iters} is below the iteration this engine reached ({st.iteration}); "
                    "pass a larger value to continue, or set engine.state.max_epochs = None to restart from zero."
                )
            st.max_iters = max_iters
            st.max_epochs = math.ceil(max_iters / st.epoch_length) if st.epoch_length else None
        if epoch_length is not None and epoch_length != st.epoch_length:
            raise ValueError(
                f"`epoch_length`={epoch_length} differs from the run being continued ({st.epoch_length}); "
                "omit it, or set engine.state.max_epochs = None to restart from zero."
            )

    def _continue_run(self, data: Iterable[Any] | None) -> None:
        st = self.state
        if data is None and st.dataloader is None and st.epoch_length is None:
            raise ValueError("`epoch_length` is required when `data` is None: the engine cannot count batches.")
        if data is not None and not _same_data(data, self._source):
            if self._iter is None:  # nothing live: position the new data where the run stands
                self._source = data
                st.dataloader = self._wrap_data(data)
            else:
                self.set_data(data)

    def _reset_filters(self) -> None:
        for d in self._dispatch.values():
            d.due = -1
            for r in d.regs:
                if r.filter is not None:
                    r.filter.reset()

    # -- state dict ------------------------------------------------------------------------------

    @property
    def state_dict_user_keys(self) -> list[str]:
        """Names of ``state`` attributes that :meth:`state_dict` saves too; append to it.

        Examples:
            >>> from ember import Engine
            >>> engine = Engine(lambda engine, batch: None)
            >>> engine.state_dict_user_keys.append("best_loss")
            >>> engine.state.best_loss = 0.25
            >>> engine.state_dict()["best_loss"]
            0.25
        """
        return self._state_dict_user_keys

    def state_dict(self) -> dict[str, Any]:
        """The run's position: ``epoch_length``, ``iteration``, ``max_epochs`` or ``max_iters``, user keys.

        When the data has ``state_dict()``, its position is saved under ``"data"``.

        Examples:
            >>> from ember import Engine
            >>> engine = Engine(lambda engine, batch: None)
            >>> _ = engine.run([1, 2, 3], max_epochs=2)
            >>> engine.state_dict()
            {'epoch_length': 3, 'iteration': 6, 'max_epochs': 2}
        """
        out = engine_state_dict(self.state, self._state_dict_user_keys, self._iter)
        if self._epoch_completion_pending() or self._epoch_owed:
            out["epoch_completed"] = False  # resumed, the run fires this epoch's EPOCH_COMPLETED first
        attached = self._states.state_dict()
        if attached:
            out["attached"] = attached
        return out

    def mark_epoch_incomplete(self) -> None:
        """From an EPOCH_COMPLETED handler: a checkpoint taken now makes a resumed run fire this EPOCH_COMPLETED again.

        :class:`~ember.handlers.Preemption` calls it when a signal cut the epoch's evaluation short, so
        the evaluation runs again, whole, after the resume. It holds for every checkpoint taken until the
        next epoch starts (the save at COMPLETED of a run stopped there included).

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda e, b: b)
            >>> saved = []
            >>> @engine.on(Events.EPOCH_COMPLETED)
            ... def cut_short(engine):
            ...     engine.mark_epoch_incomplete()
            ...     saved.append(engine.state_dict())
            >>> _ = engine.run([1, 2])
            >>> saved[0]["epoch_completed"]
            False
        """
        if self.last_event_name is not Events.EPOCH_COMPLETED:
            raise RuntimeError(
                f"mark_epoch_incomplete() is for EPOCH_COMPLETED handlers; it was called at {self.last_event_name!r}."
            )
        self._epoch_owed = True

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict`; the next :meth:`run` continues from it.

        ``epoch`` may stand in for ``iteration`` (the start of that epoch's successor). Resuming in the
        middle of an epoch delivers the batches an uninterrupted run would have seen: data with
        ``load_state_dict`` restores its own position, other data is skipped through.

        Raises:
            TypeError: ``state_dict`` is not a mapping.
            ValueError: a required key is missing, both or neither of a pair are given, or the
                position lies past the end of the run.

        Examples:
            >>> from ember import Engine
            >>> engine = Engine(lambda engine, batch: print(batch, end=" "))
            >>> engine.load_state_dict({"iteration": 5, "epoch_length": 3, "max_epochs": 3})
            >>> _ = engine.run(["a", "b", "c"])
            c a b c
        """
        if self._running:
            raise RuntimeError("load_state_dict() was called while this engine is running; call it before run().")
        self._data_state = load_engine_state(self.state, state_dict, self._state_dict_user_keys)
        self._states.load_state_dict(state_dict.get("attached", {}))
        self._loaded, self._epoch_owed = True, False
        st = self.state
        length = st.epoch_length
        full, pos = divmod(st.iteration, length) if length else (0, 0)
        if state_dict.get("epoch_completed") is False and length and pos == 0 and full > 0:
            full, pos = full - 1, length  # the last epoch's EPOCH_COMPLETED is still owed
        self._epoch_open, self._epoch_pos = pos > 0, pos
        st.epoch = full + (pos > 0)
        self._gen = self._iter = None
        self._reset_filters()


def _already_complete(st: State) -> str:
    end = (
        f"iteration {st.iteration} of {st.max_iters}"
        if st.max_iters is not None
        else (f"epoch {st.epoch} of {st.max_epochs}, iteration {st.iteration}")
    )
    return (
        f"The run loaded by load_state_dict() is already complete ({end}); run() does nothing. Pass a larger "
        "max_epochs (or max_iters) to train further, or set engine.state.max_epochs = None to start again from zero."
    )


def _same_data(a: object, b: object) -> bool:
    """Whether ``run(a)`` passes the data the run already has (the same object, or an equal one)."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # arrays compare element-wise and refuse bool(): treat as different data
        return False


def _data_length(data: Iterable[Any]) -> int | None:
    try:
        n = len(data)  # type: ignore[arg-type]
    except TypeError:
        return None
    if n == 0:
        raise ValueError("`data` is empty; pass at least one batch.")
    return n
