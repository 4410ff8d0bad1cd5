"""The engine's ``state_dict`` format and its validation on load (Ignite's rules)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ember._protocols import Stateful
from ember.engine._loop import Loop
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


def run_state_dict(loop: Loop, user_keys: list[str], states: AttachedStates) -> dict[str, Any]:
    """``Engine.state_dict``: the run's position from its loop's parts, the user keys and the attached states."""
    state = loop.engine.state
    out = engine_state_dict(state, user_keys, loop.data.saved())
    if loop.signals.ended_by_decision:
        out["terminated"] = True  # a relaunch that loads this has nothing left to run
    if loop.progress.completion_pending(state) or loop.progress.epoch_owed:
        out["epoch_completed"] = False  # resumed, the run fires this epoch's EPOCH_COMPLETED first
    attached = states.state_dict()
    if attached:
        out["attached"] = attached
    return out


def load_run_state(loop: Loop, saved: Mapping[str, Any], user_keys: list[str], states: AttachedStates) -> None:
    """``Engine.load_state_dict``: check ``saved`` and place the run's loop, user keys and attached states there."""
    if loop.running:
        raise RuntimeError("load_state_dict() was called while this engine is running; call it before run().")
    state = loop.engine.state
    loop.data.release()  # a live iterator's workers stop; the loaded position replaces its own
    loop.data.load(load_engine_state(state, saved, user_keys))
    states.load_state_dict(saved.get("attached", {}))
    loop.signals.set_terminate(saved.get("terminated") is True)  # should_terminate says so
    completed = saved.get("epoch_completed")
    loop.progress.place(state, epoch_completed=completed if isinstance(completed, bool) else None)
    loop.drop_run()
    loop.reset_filters()
