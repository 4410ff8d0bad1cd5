"""`TerminateOnNan`: stop (or raise) when the loss or any chosen output stops being finite."""

from __future__ import annotations

import logging
import numbers
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from ember.engine import Engine, Events, RemovableEventHandle, collect_handles
from ember.errors import NonFiniteError
from ember.handlers._late import OneStepLate

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

    The finiteness of ``output_transform(engine.state.output)`` is computed on device each iteration and
    read **one iteration late**: the flag of iteration ``i`` is read at iteration ``i + 1``, when its copy
    to the host has long finished, so the check never stalls the step. A NaN at iteration ``i`` therefore
    stops the run after iteration ``i + 1`` (``action="terminate"``) or raises there (``"raise"``); the
    flag of the last iteration is read at EPOCH_COMPLETED and COMPLETED. `nan_iteration` records
    where the value went bad.

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

    def __call__(self, engine: Engine) -> None:
        """Compute this iteration's flag; act on the previous one."""
        self._act(
            engine,
            self._late.push(
                engine.state.iteration, _all_finite(_numeric_leaves(self.output_transform(engine.state.output)))
            ),
        )

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
        return made.handle
