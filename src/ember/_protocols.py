"""The contracts every layer shares: objects that save their state, iterators that know their position, metrics.

Each is a ``typing.Protocol`` (checked at run time where ember decides by it), and the few functions that apply
them live here once. This module imports nothing of ember, so every layer may use it. The protocols are public:
``Stateful`` and ``TreeStateful`` in ``ember.engine``, ``ResumableIterator`` in ``ember.data``, ``FusableMetric``
and ``FusingEngine`` in ``ember.metrics``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Stateful(Protocol):
    """An object whose state a checkpoint carries as JSON (an engine, a handler, a metric): Ignite's contract.

    ``state_dict()`` returns plain data (numbers, strings, lists, dicts); ``load_state_dict(state)`` takes what it
    returned and puts the object back exactly there. A [`Checkpoint`][ember.handlers.Checkpoint] saves every
    object of its ``to_save`` that has both into the checkpoint's manifest, and an engine carries the state of what
    is attached to it ([`Engine.track_state`][ember.engine.Engine.track_state]).

    Examples:
        >>> from ember import Engine
        >>> from ember.engine import Stateful
        >>> isinstance(Engine(lambda e, b: b), Stateful), isinstance(object(), Stateful)
        (True, False)
    """

    def state_dict(self) -> Mapping[str, Any]:
        """The object's state as plain data."""
        ...

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Take back what ``state_dict()`` returned."""
        ...


@runtime_checkable
class TreeStateful(Protocol):
    """An object whose state is arrays, saved in a checkpoint's array file (a trainer's train state).

    ``tree_state_dict()`` returns ``{path: array}`` (device arrays are fine: the store copies them once);
    ``load_tree_state_dict(tree)`` takes arrays of the same paths, shapes and dtypes back, placing them as the live
    object keeps them (on its devices, with its shardings).

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.engine import TreeStateful
        >>> from ember.training import TrainState, create_trainer
        >>> state = TrainState.create(lambda p, x: x * p, jnp.ones(2), optax.sgd(0.1))
        >>> isinstance(create_trainer(state, lambda m, x: jnp.sum(m(x))), TreeStateful)
        True
    """

    def tree_state_dict(self) -> dict[str, Any]:
        """The arrays, by path."""
        ...

    def load_tree_state_dict(self, tree: dict[str, Any]) -> None:
        """Take arrays of the same paths back."""
        ...


@runtime_checkable
class ResumableIterator(Protocol):
    """An iterator that knows its position: Grain's protocol, so Grain's loaders and datasets need no adapter.

    ``get_state()`` returns the position (plain data, or ``None`` for a wrapper over data without one) and
    ``iter(data)`` followed by ``set_state(saved)`` continues exactly where the saved iterator stood. An iterator
    that runs work in the background (Grain's worker processes) also has ``close()``: the engine closes it when a
    run stops, keeping its position, and reopens the data there if the run goes on. A checkpoint of an engine
    carries the position; a wrapper that yields one batch per batch of the iterator it wraps
    ([`Mapped`][ember.data.Mapped]) passes the position through.

    Examples:
        >>> import numpy as np
        >>> from ember.data import ArrayDataset, ResumableIterator
        >>> it = iter(ArrayDataset(np.arange(6), batch_size=2))
        >>> _ = next(it); isinstance(it, ResumableIterator), it.get_state()["position"]
        (True, 1)
    """

    def get_state(self) -> Any:
        """The position."""
        ...

    def set_state(self, state: Any) -> None:
        """Continue from a position ``get_state()`` returned."""
        ...


@runtime_checkable
class FusableMetric(Protocol):
    """What a metric provides to be updated inside a training engine's compiled step.

    A training engine offers ``engine.fuse_metric(metric, reset=, compute=, per_step=)`` (see
    [`FusingEngine`][ember.metrics.FusingEngine]); when it accepts, it traces ``fused_update(state, output)`` into
    its compiled step for every batch, with ``state`` (the accumulators, a pytree of arrays, donated) going in beside
    the train state, and hands the new accumulators back through ``set_state(new, published)``, where ``published``
    is ``published_value(new)`` computed in the same step (``None`` unless ``publishes_per_step``). A metric offers
    itself only when ``fusable`` is true: its accumulators exist before the first batch, and its eager ``update`` is
    exactly ``fused_update`` (every built-in metric but ``Collect``, ``RocAuc``, ``Last`` and a class-count metric
    that learns its classes from the first batch).

    Examples:
        >>> from ember.metrics import Accuracy, Collect, FusableMetric
        >>> isinstance(Accuracy(), FusableMetric), Accuracy().fusable, Collect().fusable
        (True, True, False)
    """

    @property
    def fusable(self) -> bool:
        """Whether an engine may fold the update into its step."""
        ...

    @property
    def publishes_per_step(self) -> bool:
        """Whether the metric publishes a value every step (a running average)."""
        ...

    @property
    def state(self) -> Any:
        """The accumulators."""
        ...

    def fused_update(self, state: Any, output: Any) -> Any:
        """The new accumulators from ``state`` and one step's output; pure and jittable."""
        ...

    def published_value(self, state: Any) -> Any:
        """The value published every step from the accumulators, traced into the step (``None``: none)."""
        ...

    def set_state(self, state: Any, published: Any = None) -> None:
        """Take the accumulators the step returned, as one more update."""
        ...


@runtime_checkable
class FusingEngine(Protocol):
    """An engine that runs metric updates inside its compiled step (a training engine): metrics offer themselves.

    ``fuse_metric(metric, reset=, compute=, per_step=)`` returns how to take the metric out again, or ``None``
    when the engine refuses (a per-device placement, ``debug=True``, a metric the K-step group cannot run).

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember import Engine
        >>> from ember.metrics import FusingEngine
        >>> from ember.training import TrainState, create_trainer
        >>> state = TrainState.create(lambda p, x: x * p, jnp.ones(2), optax.sgd(0.1))
        >>> isinstance(create_trainer(state, lambda m, x: jnp.sum(m(x))), FusingEngine)
        True
        >>> isinstance(Engine(lambda e, b: b), FusingEngine)
        False
    """

    def fuse_metric(
        self, metric: FusableMetric, *, reset: Any, compute: Any, per_step: bool
    ) -> Callable[[], None] | None:
        """Fold ``metric``'s update into the step; return how to take it out, or ``None``."""
        ...


def position(it: object) -> Any:
    """The position of iterator ``it`` (``None``: it has none; ember's wrappers say so over data without one)."""
    return it.get_state() if isinstance(it, ResumableIterator) else None


def restore(it: object, state: Any) -> None:
    """``it.set_state(state)``, or a clear error when ``it`` has no position to restore."""
    if not isinstance(it, ResumableIterator):
        raise TypeError(f"This data's iterator ({type(it).__name__}) has no set_state() to restore a position with.")
    it.set_state(state)


def reopen(data: Iterable[Any], state: Any) -> Iterator[Any]:
    """A new iterator over ``data``, set to the saved position ``state``."""
    it = iter(data)
    if not isinstance(it, ResumableIterator):
        raise ValueError(
            f"The engine holds a saved position in its data, but the iterator of this data ({type(it).__name__}) "
            "has no get_state()/set_state() to continue from it. Resume with the data the run was saved with "
            "(an ArrayDataset, a Grain loader or dataset, or any iterable whose iterator has both)."
        )
    it.set_state(state)
    return it


def close(it: object) -> None:
    """Stop what ``it`` runs in the background (Grain's worker processes), if it has ``close()``."""
    stop = getattr(it, "close", None)
    if callable(stop):
        stop()


def release(it: object) -> Any:
    """Close an iterator that has a position and return the position; ``None`` (nothing done) for any other.

    Other iterators stay open, as Ignite keeps them: a generator continues where it stopped when the run does.
    """
    state = position(it)
    if state is not None:
        close(it)
    return state
