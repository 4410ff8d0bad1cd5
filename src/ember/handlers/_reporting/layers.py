"""Per-layer gradient and weight logging, as Ignite's `GradsScalarHandler`, `WeightsHistHandler` and the rest.

The numbers are computed inside the compiled step when the trainer is asked for them (``extras=`` of
``create_trainer``: ``grad_norms``, ``param_norms``, ``grads``), left on the device, and handed to the
writer only when the handler's event fires: nothing is read per step. Histograms are counted on the
arrays' own devices ([`ember.writers.histogram`][ember.writers.histogram]), on every process for state
sharded across processes, so no parameter or gradient is ever gathered to one host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from ember.engine import Engine, Events, EventsList, FilteredEvent, RemovableEventHandle, collect_handles
from ember.handlers._reporting.loggers import as_async
from ember.writers import Writer


def _layer_values(engine: Engine, key: str, handler: str) -> Any:
    output = engine.state.output
    if not isinstance(output, Mapping) or key not in output:
        raise KeyError(
            f"{handler} reads output[{key!r}], which the step does not return; build the trainer with "
            f"create_trainer(..., extras=({key!r},))."
        )
    return output[key]


def _name(path: Any) -> str:
    return ".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


class _LayerHandler:
    """Writes per-layer values to ``writer`` under ``tag/...`` when its event fires (``attach``).

    Subclasses name the step output they read (``key``; ``None``: the current parameters) and whether
    each layer is a norm (a scalar, ``tag/norm/<layer>``) or an array (a histogram, ``tag/<layer>``).
    """

    key: str | None = None  # the step output read; None: the trainer's current parameters
    histograms = False
    default_tag = ""

    def __init__(self, writer: Writer, tag: str | None = None) -> None:
        tag = self.default_tag if tag is None else tag
        if not isinstance(writer, Writer):
            raise TypeError(f"`writer` must be an ember.writers.Writer, got {type(writer).__name__}.")
        if not isinstance(tag, str) or not tag:
            raise ValueError(f"`tag` must be a non-empty string, got {tag!r}.")
        self.writer, self.tag = writer, tag

    def attach(self, engine: Engine, event: Events | FilteredEvent | EventsList | None = None) -> RemovableEventHandle:
        """Write on ``engine``'s ``event`` (``Events.ITERATION_COMPLETED(every=100)`` by default).

        Examples:
            >>> from ember import Engine, Events
            >>> from ember.handlers import GradsScalarHandler
            >>> from ember.writers import ConsoleWriter
            >>> handle = GradsScalarHandler(ConsoleWriter()).attach(Engine(lambda e, b: b), Events.EPOCH_COMPLETED)
        """
        with collect_handles() as made:
            engine.add_event_handler(event if event is not None else Events.ITERATION_COMPLETED(every=100), self)
            self.writer = as_async(self.writer, engine)
        return made.handle

    def __call__(self, engine: Engine) -> None:
        """Hand this step's values to the writer (device arrays: its thread reads them)."""
        step = engine.state.iteration
        if self.key is not None:
            values = _layer_values(engine, self.key, type(self).__name__)
        else:
            state = getattr(engine.state, "train_state", None)
            if state is None:
                raise TypeError(f"{type(self).__name__} reads engine.state.train_state; attach it to a trainer.")
            values = state.params  # the writer counts histograms on device now, before the next step donates them
        if not self.histograms:
            self.writer.write_scalars(step, {f"{self.tag}/norm/{k}": v for k, v in values.items()})
            return
        for path, leaf in jax.tree_util.tree_flatten_with_path(values)[0]:
            self.writer.write_histogram(step, f"{self.tag}/{_name(path)}", leaf)


class GradsScalarHandler(_LayerHandler):
    """Writes each parameter's gradient norm as ``tag/norm/<layer>`` (Ignite's ``GradsScalarHandler``).

    Needs ``create_trainer(..., extras=("grad_norms",))``: the norms are computed in the step.

    Args:
        writer: where the numbers go.
        tag: the prefix of every name.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember import Events
        >>> from ember.handlers import GradsScalarHandler
        >>> from ember.training import TrainState, create_trainer
        >>> from ember.writers import ConsoleWriter
        >>> state = TrainState.create(lambda p, x: x @ p["w"], {"w": jnp.ones((2,))}, optax.sgd(0.1))
        >>> trainer = create_trainer(state, lambda m, b: jnp.mean(m(b) ** 2), extras=("grad_norms",))
        >>> _ = GradsScalarHandler(ConsoleWriter()).attach(trainer, Events.COMPLETED)
        >>> _ = trainer.run([jnp.ones((4, 2))])
        step 1 | grads/norm/w 5.6569
    """

    key, default_tag = "grad_norms", "grads"


class WeightsScalarHandler(_LayerHandler):
    """Writes each parameter's norm as ``tag/norm/<layer>`` (Ignite's ``WeightsScalarHandler``).

    Needs ``create_trainer(..., extras=("param_norms",))``: the norms are computed in the step.

    Args:
        writer: where the numbers go.
        tag: the prefix of every name.

    Examples:
        >>> from ember import Engine, Events
        >>> from ember.handlers import WeightsScalarHandler
        >>> from ember.writers import ConsoleWriter
        >>> handler = WeightsScalarHandler(ConsoleWriter(), tag="w")
        >>> handle = handler.attach(Engine(lambda e, b: b), Events.ITERATION_COMPLETED(every=50))
    """

    key, default_tag = "param_norms", "weights"


class GradsHistHandler(_LayerHandler):
    """Writes a histogram of each parameter's gradient as ``tag/<layer>`` (Ignite's ``GradsHistHandler``).

    Needs ``create_trainer(..., extras=("grads",))``: the step returns its gradients.

    Args:
        writer: where the histograms go (one that shows them: TensorBoard).
        tag: the prefix of every name.

    Examples:
        >>> from ember import Engine, Events
        >>> from ember.handlers import GradsHistHandler
        >>> from ember.writers import ConsoleWriter
        >>> handle = GradsHistHandler(ConsoleWriter()).attach(Engine(lambda e, b: b), Events.EPOCH_COMPLETED)
    """

    key, default_tag, histograms = "grads", "grads", True


class WeightsHistHandler(_LayerHandler):
    """Writes a histogram of each parameter as ``tag/<layer>`` (Ignite's ``WeightsHistHandler``).

    Reads the trainer's current parameters (``engine.state.train_state.params``); no extra is needed.

    Args:
        writer: where the histograms go (one that shows them: TensorBoard).
        tag: the prefix of every name.

    Examples:
        >>> from ember import Engine, Events
        >>> from ember.handlers import WeightsHistHandler
        >>> from ember.writers import ConsoleWriter
        >>> handle = WeightsHistHandler(ConsoleWriter()).attach(Engine(lambda e, b: b), Events.EPOCH_COMPLETED)
    """

    default_tag, histograms = "weights", True
