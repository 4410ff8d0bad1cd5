"""`TerminateOnNan`: stop (or raise) when the loss or any chosen output stops being finite."""

from __future__ import annotations

import logging
import numbers
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from ember._protocols import FusingEngine
from ember.engine import Engine, Events, RemovableEventHandle, collect_handles
from ember.errors import NonFiniteError
from ember.handlers._reporting.late import OneStepLate

log = logging.getLogger("ember")


@jax.jit
def _all_finite(leaves: list[Any]) -> jax.Array:
    flags = [jnp.all(jnp.isfinite(x)) for x in leaves if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
    return jnp.all(jnp.stack(flags)) if flags else jnp.array(True)


def _numeric_leaves(tree: Any) -> list[Any]:
    """The leaves of ``tree`` that are numbers or arrays; others (a string, a name) are skipped, as Ignite does."""
    return [x for x in jax.tree.leaves(tree) if isinstance(x, numbers.Number | jax.Array | np.ndarray | np.generic)]


class TerminateOnNan:
    """Stops the engine (or raises ``NonFiniteError``) once an output holds a NaN or an infinity.

    The finiteness of ``output_transform(engine.state.output)`` is computed on device each iteration (inside the
    compiled step of a training engine that folds updates into it, as it does for metrics; as a call of its own
    elsewhere, or when ``output_transform`` cannot be traced) and read **one iteration late**: the flag of iteration
    ``i`` is read at iteration ``i + 1``, when its copy to the host has long finished, so the check never stalls the
    step. A NaN at iteration ``i`` therefore stops the run after iteration ``i + 1`` (``action="terminate"``) or raises
    there (``"raise"``); the flag of the last iteration is read at EPOCH_COMPLETED and COMPLETED. `nan_iteration`
    records where the value went bad.

    Args:
        output_transform: picks what to check from the output (everything by default; float leaves only:
            integers, booleans and non-numeric parts such as strings are skipped).
        action: ``"terminate"`` (Ignite's behaviour) or ``"raise"``.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember import Engine
        >>> from ember.handlers import TerminateOnNan
        >>> engine = Engine(lambda e, b: {"loss": jnp.log(jnp.float32(b))})
        >>> guard = TerminateOnNan()
        >>> _ = guard.attach(engine)
        >>> engine.run([1.0, 2.0, -1.0, 3.0, 4.0, 5.0]).iteration, guard.nan_iteration
        (4, 3)
    """

    def __init__(
        self,
        output_transform: Callable[[Any], Any] = lambda output: output,
        *,
        action: Literal["terminate", "raise"] = "terminate",
    ) -> None:
        if not callable(output_transform):
            raise TypeError(f"`output_transform` must be callable, got {output_transform!r}.")
        if action not in ("terminate", "raise"):
            raise ValueError(f'`action` must be "terminate" or "raise", got {action!r}.')
        self.output_transform, self.action = output_transform, action
        self.nan_iteration: int | None = None
        self._late = OneStepLate()
        self._watch: _FiniteWatch | None = None  # the check inside the engine's compiled step, when it takes it

    def __call__(self, engine: Engine) -> None:
        """Take this iteration's flag (computed in the step, or now); act on the previous one."""
        watch = self._watch
        if watch is not None and watch.traced:
            flag = watch.flag
        else:
            flag = _all_finite(_numeric_leaves(self.output_transform(engine.state.output)))
        self._act(engine, self._late.push(engine.state.iteration, flag))

    def _act(self, engine: Engine, read: tuple[int, Any] | None) -> None:
        if read is None or bool(read[1]) or self.nan_iteration is not None:
            return
        self.nan_iteration = read[0]
        message = f"A NaN or infinite output at iteration {read[0]} (seen at iteration {engine.state.iteration})."
        if self.action == "raise":
            raise NonFiniteError(message)
        log.warning("%s Stopping the run.", message)
        engine.terminate()

    def _drain(self, engine: Engine) -> None:
        self._act(engine, self._late.drain())

    def _started(self) -> None:
        self.nan_iteration = None
        self._late.drain()
        if self._watch is not None:
            self._watch.reset()

    def attach(self, engine: Engine) -> RemovableEventHandle:
        """Check every iteration; read the last flag at EPOCH_COMPLETED and COMPLETED.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import TerminateOnNan
            >>> handle = TerminateOnNan(lambda out: out["loss"]).attach(Engine(lambda e, b: b))
        """
        with collect_handles() as made:
            engine.add_event_handler(Events.STARTED, self._started)
            engine.add_event_handler(Events.EPOCH_COMPLETED | Events.COMPLETED, self._drain)
            engine.add_event_handler(Events.ITERATION_COMPLETED, self)
            if isinstance(engine, FusingEngine):  # a training engine: the check runs inside its compiled step
                watch = _FiniteWatch(self.output_transform)
                undo = engine.fuse_metric(
                    watch, reset=Events.STARTED, compute=Events.ITERATION_COMPLETED, per_step=True
                )
                if undo is not None:  # else refused (Pmap, debug=True): the check stays a call of its own
                    self._watch = watch
                    made.on_remove(undo)
        return made.handle


class _FiniteWatch:
    """The finiteness check as a training engine's compiled step runs it: a count of the non-finite steps of the run.

    It follows the contract of a fused metric (``state``, ``fused_update``, ``published_value``, ``set_state``); the
    value it publishes each step is whether every step of the run so far was finite. An ``output_transform`` that
    cannot be traced (it reads a host number) leaves the count alone and ``traced`` false: the handler then checks
    each output itself.
    """

    fusable = True
    publishes_per_step = True

    def __init__(self, output_transform: Callable[[Any], Any]) -> None:
        self.output_transform = output_transform
        self.traced = True
        self.flag: Any = None  # the last step's published flag, on device
        self.state: Any = None
        self.reset()

    def reset(self) -> None:
        self.state, self.flag = np.zeros((), np.int32), None

    def fused_update(self, state: Any, output: Any) -> Any:
        try:
            picked = self.output_transform(output)
        except jax.errors.JAXTypeError:  # needs host values: the handler computes the flag per iteration instead
            self.traced = False
            return state
        self.traced = True
        return state + jnp.logical_not(_all_finite(_numeric_leaves(picked))).astype(jnp.int32)

    def published_value(self, state: Any) -> Any:
        return state == 0

    def set_state(self, state: Any, published: Any = None) -> None:
        self.state, self.flag = state, published
