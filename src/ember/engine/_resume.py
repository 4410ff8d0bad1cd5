"""The engine's ``state_dict`` format and its validation on load (Ignite's rules)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ember._protocols import Stateful
from ember.engine._events import EventEnum, Events
from ember.engine._position import DataPosition
from ember.engine._progress import Progress
from ember.engine._signals import Signals
from ember.engine._state import State


def engine_state_dict(state: State, user_keys: list[str], where: Any = None) -> dict[str, Any]:
    """The keys Ignite saves, user keys, and the data's position ``where`` (`DataPosition.saved`).

    The position is the iterator's, never the data's: engines that iterate one data set (an evaluator
    over the training set) each have their own.
    """
    out: dict[str, Any] = {"epoch_length": state.epoch_length, "iteration": state.iteration}
    if state.max_iters is not None:
        out["max_iters"] = state.max_iters
    else:
        out["max_epochs"] = state.max_epochs
    for k in user_keys:
        if not hasattr(state, k):
            raise AttributeError(
                f"`state_dict_user_keys` names {k!r}, but engine.state has no attribute {k!r}; set it first."
            )
        out[k] = getattr(state, k)
    if where is not None:
        out["data"] = where
    return out


def _one_of(sd: Mapping[str, Any], a: str, b: str) -> str:
    given = [k for k in (a, b) if k in sd]
    if len(given) != 1:
        raise ValueError(f"`state_dict` must hold exactly one of {a!r} and {b!r}; it holds {sorted(sd)}.")
    return given[0]


def _count(sd: Mapping[str, Any], key: str, *, allow_zero: bool) -> int:
    v = sd[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < (0 if allow_zero else 1):
        kind = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"`state_dict[{key!r}]` must be {kind} int, got {v!r}.")
    return v


def load_engine_state(state: State, sd: Mapping[str, Any], user_keys: list[str]) -> Any:
    """Check ``sd`` and write it into ``state``; return the saved data position, if any."""
    if not isinstance(sd, Mapping):
        raise TypeError(f"`state_dict` must be a mapping, got {type(sd).__name__}.")
    if "epoch_length" not in sd:
        raise ValueError(f"`state_dict` is missing the required key 'epoch_length'; it holds {sorted(sd)}.")
    missing = [k for k in user_keys if k not in sd]
    if missing:
        raise ValueError(f"`state_dict` is missing the user keys {missing} named in state_dict_user_keys.")
    position, limit = _one_of(sd, "iteration", "epoch"), _one_of(sd, "max_epochs", "max_iters")
    if sd[limit] is None and not sd[position]:  # a fresh engine's state: nothing has run yet
        state.iteration = state.epoch = 0
        state.max_epochs = state.max_iters = state.epoch_length = None
        for k in user_keys:
            setattr(state, k, sd[k])
        return sd.get("data")
    epoch_length = None if sd["epoch_length"] is None else _count(sd, "epoch_length", allow_zero=False)
    n = _count(sd, position, allow_zero=True)
    if position == "epoch":
        if epoch_length is None:
            raise ValueError("`state_dict` gives 'epoch' but 'epoch_length' is None; give 'iteration' instead.")
        iteration = n * epoch_length
    else:
        iteration = n
        if epoch_length is None and iteration > 0:
            raise ValueError(
                f"`state_dict` places the run at iteration {iteration} but 'epoch_length' is None; "
                "the engine cannot tell where in an epoch that is."
            )
    m = _count(sd, limit, allow_zero=False)
    end = m if limit == "max_iters" else (m * epoch_length if epoch_length else None)
    if end is not None and iteration > end:
        raise ValueError(f"`state_dict` places the run at iteration {iteration}, past its end at iteration {end}.")
    state.epoch_length = epoch_length
    state.iteration = iteration
    if limit == "max_iters":
        state.max_epochs, state.max_iters = None, m
    else:
        state.max_epochs, state.max_iters = m, None
    for k in user_keys:
        setattr(state, k, sd[k])
    return sd.get("data")


class AttachedStates:
    """Objects whose ``state_dict()`` travels inside an engine's, under ``"attached"``, by name (metrics).

    A saved state whose object is not attached yet waits for it: attaching after a resume still restores it.
    """

    def __init__(self) -> None:
        self._objects: dict[str, Any] = {}
        self._waiting: dict[str, Any] = {}

    def add(self, name: str, obj: Any) -> Callable[[], None]:
        """Track ``obj`` under ``name``; return how to stop tracking it."""
        if not isinstance(obj, Stateful):
            raise TypeError(f"`obj` must have state_dict() and load_state_dict(), got {type(obj).__name__}.")
        held = self._objects.get(name)
        if held is not None and held is not obj:
            raise ValueError(f"The engine already saves the state of another object as {name!r}; pick another name.")
        self._objects[name] = obj
        if name in self._waiting:
            obj.load_state_dict(self._waiting.pop(name))

        def remove() -> None:
            if self._objects.get(name) is obj:
                del self._objects[name]

        return remove

    def state_dict(self) -> dict[str, Any]:
        return {name: obj.state_dict() for name, obj in self._objects.items()}

    def load_state_dict(self, saved: Any) -> None:
        if not isinstance(saved, Mapping):
            kind = type(saved).__name__
            raise TypeError(f"`state_dict['attached']` must be a mapping of names to states, got {kind}.")
        for name, state in saved.items():
            if name in self._objects:
                self._objects[name].load_state_dict(state)
            else:
                self._waiting[name] = state


class Resume:
    """Saving and restoring a run's position (Ignite's ``Serializable``): the engine's ``state_dict`` and its load.

    Its own parts are the user keys and the attached states; it reads and writes the run loop's (the state, the
    signals, the progress, the data position). ``Engine`` is made of it, the run loop, the run setup and the handler
    registry.

    Examples:
        >>> from ember import Engine
        >>> engine = Engine(lambda engine, batch: None)
        >>> engine.load_state_dict({"iteration": 4, "epoch_length": 2, "max_epochs": 3})
        >>> engine.state.epoch, engine.run([0, 1]).iteration
        (2, 6)
    """

    # the run loop's parts (`RunLoop`)
    state: State
    last_event_name: EventEnum | str | None
    _signals: Signals
    _progress: Progress
    _data: DataPosition
    _running: bool
    _reset_filters: Callable[[], None]
    _drop_run: Callable[[], None]

    def __init__(self) -> None:
        self._state_dict_user_keys: list[str] = []
        self._states = AttachedStates()

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
        out = engine_state_dict(self.state, self._state_dict_user_keys, self._data.saved())
        if self._signals.ended_by_decision:
            out["terminated"] = True  # a relaunch that loads this has nothing left to run
        if self._progress.completion_pending(self.state) or self._progress.epoch_owed:
            out["epoch_completed"] = False  # resumed, the run fires this epoch's EPOCH_COMPLETED first
        attached = self._states.state_dict()
        if attached:
            out["attached"] = attached
        return out

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
        self._progress.epoch_owed = True

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
        if self._running:
            raise RuntimeError("load_state_dict() was called while this engine is running; call it before run().")
        self._data.release()  # a live iterator's workers stop; the loaded position replaces its own
        self._data.load(load_engine_state(self.state, state_dict, self._state_dict_user_keys))
        self._states.load_state_dict(state_dict.get("attached", {}))
        self._signals.set_terminate(state_dict.get("terminated") is True)  # should_terminate says so
        completed = state_dict.get("epoch_completed")
        self._progress.place(self.state, epoch_completed=completed if isinstance(completed, bool) else None)
        self._drop_run()
        self._reset_filters()
