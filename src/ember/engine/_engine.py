"""`Engine`: runs a process function over data and fires events to registered handlers."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, cast

from ember.engine._events import EventEnum, Events, FilteredEvent
from ember.engine._handlers import EventHandlers
from ember.engine._handles import RemovableEventHandle
from ember.engine._loop import INTERRUPT, PAUSE, Loop, outermost
from ember.engine._resume import AttachedStates, load_run_state, run_state_dict
from ember.engine._runs import prepare_run, set_data
from ember.engine._state import State
from ember.engine._validate import check_process_fn

ProcessFn = Callable[["Engine", Any], Any]


class Engine(EventHandlers):
    """Runs ``process_fn(engine, batch)`` over data, firing [`Events`][ember.engine.Events] to registered handlers.

    The engine owns the loop and the counters (Python ints in `state`); the process function owns the work. Handlers
    attach with [`on`][ember.engine.Engine.on] or [`add_event_handler`][ember.engine.Engine.add_event_handler],
    optionally filtered (``Events.ITERATION_COMPLETED(every=25)``), and run in registration order. The event order,
    termination, resumption and ``state_dict`` follow PyTorch Ignite; ``docs/concepts/events.md`` lists where ember
    deliberately differs.

    Args:
        process_fn: ``process_fn(engine, batch) -> output``; ``output`` lands in ``state.output``.

    Attributes:
        state: the run's [`State`][ember.engine.State].
        last_event_name: the event fired last.
        logger: the engine's ``logging.Logger``, named as Ignite names its own
            (``"ember.engine._engine.Engine"``, the class name last): run start and resume, each epoch's and the
            run's time, ``terminate``/``interrupt`` requests at INFO, an exception that ends the run at ERROR.
        interrupt_resume_enabled: class attribute, ``True``; set it to ``False`` to make
            [`interrupt`][ember.engine.Engine.interrupt] raise, as Ignite does.

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

    interrupt_resume_enabled = True

    def __init__(self, process_fn: ProcessFn) -> None:
        check_process_fn(process_fn)
        super().__init__()  # the registry: one dispatch table per event, the counter each event's filters read
        self.state = State()
        self.last_event_name: EventEnum | str | None = None
        self.logger = logging.getLogger(f"ember.engine._engine.{type(self).__name__}")
        # the run: its generator, signals, progress and data position; it fires this engine's dispatch table
        self._loop = Loop(self, process_fn, self._dispatch, self._wrap_data)
        # what a checkpoint of the run holds besides the loop's position: user keys, attached objects' states
        self._state_dict_user_keys: list[str] = []
        self._states = AttachedStates()

    def _wrap_data(self, data: Iterable[Any]) -> Iterable[Any]:
        """What the engine iterates for ``data``; a `TrainingEngine` puts it on its devices."""
        return data

    def track_state(self, name: str, obj: Any) -> Callable[[], None]:
        """Save ``obj.state_dict()`` inside this engine's ``state_dict``, and restore it with it.

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

    # -- saving and restoring the run's position (Ignite's ``Serializable``) ----------------------

    @property
    def state_dict_user_keys(self) -> list[str]:
        """Names of ``state`` attributes that [`state_dict`][ember.engine.Engine.state_dict] saves too; append to it.

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

        When the data's iterator has ``get_state()`` (Grain's protocol: [`ArrayDataset`][ember.data.ArrayDataset], Grain
        loaders and datasets), its position is saved under ``"data"``.

        Examples:
            >>> from ember import Engine
            >>> engine = Engine(lambda engine, batch: None)
            >>> _ = engine.run([1, 2, 3], max_epochs=2)
            >>> engine.state_dict()
            {'epoch_length': 3, 'iteration': 6, 'max_epochs': 2}
        """
        return run_state_dict(self._loop, self._state_dict_user_keys, self._states)

    def mark_epoch_incomplete(self) -> None:
        """From an EPOCH_COMPLETED handler: a checkpoint taken now makes a resumed run fire this EPOCH_COMPLETED again.

        [`Preemption`][ember.handlers.Preemption] calls it when a signal cut the epoch's evaluation short, so the
        evaluation runs again, whole, after the resume. It holds for every checkpoint taken until the next epoch starts
        (the save at COMPLETED of a run stopped there included).

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
        self._loop.progress.epoch_owed = True

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a position saved by [`state_dict`][ember.engine.Engine.state_dict]; the next `run` continues from it.

        ``epoch`` may stand in for ``iteration`` (the start of that epoch's successor). Resuming in the
        middle of an epoch delivers the batches an uninterrupted run would have seen: data whose iterator
        has ``get_state``/``set_state`` continues from its saved position, other data is skipped through.

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
        load_run_state(self._loop, state_dict, self._state_dict_user_keys, self._states)

    # -- control ---------------------------------------------------------------------------------

    def terminate(self, skip_completed: bool = False, *, final: bool = True) -> None:
        """Stop the run once the current event's handlers have run; TERMINATE then COMPLETED fire.

        A later [`run`][ember.engine.Engine.run] in this process continues from the next iteration, so no batch is
        skipped or repeated (Ignite's rule). A relaunch does not: the decision (early stopping, a time limit, NaN)
        is saved in [`state_dict`][ember.engine.Engine.state_dict] as ``"terminated": True``, and a run loaded from it
        is complete: ``run()`` warns and does nothing, and ``should_terminate`` is ``True`` until you set it to
        ``False`` to train on.

        Args:
            skip_completed: do not fire COMPLETED after TERMINATE.
            final: ``False`` stops the run without ending it for a relaunch: the saved state says nothing, and a run
                loaded from it trains on (what [`Preemption`][ember.handlers.Preemption] does on SIGTERM).

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> _ = engine.add_event_handler(Events.ITERATION_COMPLETED(once=13), lambda e: e.terminate())
            >>> engine.run(range(10), max_epochs=5).iteration
            13
            >>> engine.run().iteration
            50
        """
        self.logger.info("Terminate signaled. Engine will stop after current iteration is finished.")
        self._loop.signals.set_terminate("skip_completed" if skip_completed else True, final=final)

    def terminate_epoch(self, skip_epoch_completed: bool = False) -> None:
        """End the current epoch once the current event's handlers have run; the next epoch follows.

        TERMINATE_SINGLE_EPOCH fires, then EPOCH_COMPLETED (unless skipped). Called from STARTED or EPOCH_STARTED it
        makes [`run`][ember.engine.Engine.run] raise ``RuntimeError``; from EPOCH_COMPLETED it does nothing.

        Args:
            skip_epoch_completed: do not fire EPOCH_COMPLETED for the ended epoch.

        Examples:
            >>> from ember import Engine, Events
            >>> engine = Engine(lambda engine, batch: None)
            >>> _ = engine.add_event_handler(Events.ITERATION_COMPLETED(every=2), lambda e: e.terminate_epoch())
            >>> engine.run(range(10), max_epochs=3).iteration
            6
        """
        self.logger.info("Terminate current epoch is signaled. The epoch ends after current iteration is finished.")
        self._loop.signals.set_terminate_epoch("skip_epoch_completed" if skip_epoch_completed else True)

    def interrupt(self) -> None:
        """Return from [`run`][ember.engine.Engine.run] once the current event's handlers have run; INTERRUPT fires.

        The next [`run`][ember.engine.Engine.run] resumes exactly there, with the same data iterator and no second
        STARTED.

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

        Raises:
            RuntimeError: ``Engine.interrupt_resume_enabled`` is ``False`` (Ignite's switch for its former behaviour).
        """
        if not self.interrupt_resume_enabled:
            raise RuntimeError(
                "interrupt() is disabled: Engine.interrupt_resume_enabled is False. Set it to True to interrupt "
                "and resume runs, or call terminate() to end the run."
            )
        self.logger.info("interrupt signaled. Engine will interrupt the run after current iteration is finished.")
        self._loop.signals.set_interrupt(True)

    def _request_pause(self) -> None:
        self._loop.signals.set_pause(True)

    @property
    def should_terminate(self) -> bool | str:
        """``True`` once ``terminate()`` was called (``"skip_completed"`` with ``skip_completed=True``), as Ignite.

        Setting it to ``True`` from a handler stops the run as ``terminate()`` does; it is cleared when a run starts.
        """
        return self._loop.signals.terminate

    @should_terminate.setter
    def should_terminate(self, value: bool | str) -> None:
        self._loop.signals.set_terminate(value)

    @property
    def should_terminate_single_epoch(self) -> bool | str:
        """``True`` once ``terminate_epoch()`` was called (``"skip_epoch_completed"`` when it skips EPOCH_COMPLETED).

        Setting it from a handler ends the epoch as ``terminate_epoch()`` does; it is cleared once the epoch ends.
        """
        return self._loop.signals.epoch_request

    @should_terminate_single_epoch.setter
    def should_terminate_single_epoch(self, value: bool | str) -> None:
        self._loop.signals.set_terminate_epoch(value)

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
        set_data(self._loop, data)

    # -- running ---------------------------------------------------------------------------------

    def run(
        self,
        data: Iterable[Any] | None = None,
        max_epochs: int | None = None,
        max_iters: int | None = None,
        epoch_length: int | None = None,
    ) -> State:
        """Run, or continue, over ``data``; return the state.

        A new run starts at iteration 0 when the engine has never run, when its last run finished, or when the limit
        the run counts by (``state.max_epochs``, or ``state.max_iters``) was set to ``None``. Otherwise (after
        [`terminate`][ember.engine.Engine.terminate], [`interrupt`][ember.engine.Engine.interrupt], an exception, or
        [`load_state_dict`][ember.engine.Engine.load_state_dict]) the run continues where it stopped, and a larger
        ``max_epochs`` extends it. A run loaded by [`load_state_dict`][ember.engine.Engine.load_state_dict] that is
        already complete stays complete: ``run()`` fires nothing and warns, unless ``max_epochs`` (or ``max_iters``)
        asks for more; so relaunching a finished job never trains it again.

        Args:
            data: an iterable of batches, or ``None`` to call the process function with ``None``
                (``epoch_length`` is then required). Data whose iterator has ``get_state``/``set_state``
                (Grain's protocol) saves and restores its position with the engine's; such an iterator
                is closed when the run stops (Grain's worker processes end) and reopened where it stood
                if the run goes on.
            max_epochs: epochs to run (default 1 for a new run).
            max_iters: iterations to run, instead of ``max_epochs``.
            epoch_length: iterations per epoch (default ``len(data)``, or learned at the end of the
                first epoch for data without a length).

        Returns:
            The engine's [`State`][ember.engine.State].

        Raises:
            TypeError: ``data`` is not iterable, or an argument has the wrong type.
            ValueError: conflicting or out-of-range arguments, empty data, or ``max_iters`` for a run that counts
                epochs (``max_epochs`` for one that counts iterations) before that run's limit was reset to ``None``.
            RuntimeError: called from inside this engine's own run.

        Examples:
            >>> from ember import Engine
            >>> engine = Engine(lambda engine, batch: batch)
            >>> engine.run([1, 2, 3], max_epochs=2).iteration
            6
            >>> engine.run([1, 2, 3], max_epochs=3).iteration  # continues: one more epoch
            9
        """
        if not prepare_run(self._loop, data, max_epochs, max_iters, epoch_length):
            return self.state
        try:
            for signal in self._loop.drive():
                if signal is INTERRUPT:
                    break
        finally:
            self._loop.data.release()
        return self.state

    def iterate(
        self, data: Iterable[Any] | None, event: EventEnum | FilteredEvent, **run_kwargs: Any
    ) -> Iterator[State]:
        """Run as a generator that yields the state each time ``event`` fires.

        All handlers of the event have run when the state is yielded. Leaving the loop early leaves the engine
        resumable, as after [`interrupt`][ember.engine.Engine.interrupt]: the next ``run()`` or ``iterate()`` continues.

        Args:
            data: as for [`run`][ember.engine.Engine.run].
            event: the event to yield on, usually filtered.
            **run_kwargs: ``max_epochs``, ``max_iters`` or ``epoch_length``, as for [`run`][ember.engine.Engine.run].

        Yields:
            The engine's [`State`][ember.engine.State].

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
        if not prepare_run(self._loop, data, **run_kwargs):
            return iter(())
        handle = self.add_event_handler(event, self._request_pause)
        return self._iterate(handle)

    def _iterate(self, handle: RemovableEventHandle) -> Iterator[State]:
        try:
            for signal in self._loop.drive():
                if signal is PAUSE:
                    yield self.state
                elif signal is INTERRUPT:
                    return
        finally:
            handle.remove()
            self._loop.data.release()

    @property
    def process_function(self) -> ProcessFn:
        """The function each iteration runs, ``process_function(engine, batch)``, as the engine was made with it.

        Examples:
            >>> from ember import Engine
            >>> step = lambda engine, batch: batch * 2
            >>> Engine(step).process_function is step
            True
        """
        return self._loop.process_fn

    @property
    def running(self) -> bool:
        """Whether a run of this engine is in progress: inside ``run()``, or an ``iterate()`` not yet finished.

        Loading a state into a running engine is refused (``load_state_dict``, ``load_objects``).

        Examples:
            >>> from ember import Engine, Events
            >>> engine, seen = Engine(lambda e, b: b), []
            >>> _ = engine.add_event_handler(Events.STARTED, lambda e: seen.append(e.running))
            >>> _ = engine.run([1]); seen, engine.running
            ([True], False)
        """
        return self._loop.running

    @property
    def outer_engine(self) -> Engine | None:
        """The engine whose run this engine's run was started from (by one of its handlers), or ``None``.

        The outermost one when runs nest deeper. A handler that finishes work at COMPLETED (a background
        checkpoint) can leave an evaluator's run nested in a trainer's and finish when the trainer's run ends.

        Examples:
            >>> from ember import Engine, Events
            >>> trainer, evaluator = Engine(lambda e, b: b), Engine(lambda e, b: b)
            >>> seen = []
            >>> _ = evaluator.add_event_handler(Events.COMPLETED, lambda e: seen.append(e.outer_engine is trainer))
            >>> _ = trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: evaluator.run([1]))
            >>> _ = trainer.run([1, 2]); _ = evaluator.run([1])
            >>> seen, evaluator.outer_engine
            ([True, False], None)
        """
        outer = outermost() if self._loop.running else self
        return None if outer is self else cast("Engine | None", outer)  # the loop's engines are Engines
