"""`EpochOutputStore`: keeps an epoch's outputs (on device, as they come), Ignite's handler."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.engine import Engine, Events, RemovableEventHandle, collect_handles


class EpochOutputStore:
    """Keeps each iteration's ``output_transform(engine.state.output)`` of the current epoch in `data` (Ignite's).

    The outputs are kept as the engine produced them: device arrays stay on the device and nothing is read back per
    step, so an evaluator's predictions over a validation set are one ``np.concatenate`` away once the epoch ended.
    Like Ignite's, it holds every output of an epoch: mind the device memory on a large set.

    Args:
        output_transform: picks what to keep from each output (all of it by default).

    Attributes:
        data: the outputs of the epoch so far; a new list at each EPOCH_STARTED.

    Examples:
        >>> import numpy as np
        >>> from ember import Engine
        >>> from ember.handlers import EpochOutputStore
        >>> evaluator = Engine(lambda e, batch: {"y_pred": np.asarray(batch) * 2, "y": np.asarray(batch)})
        >>> store = EpochOutputStore(output_transform=lambda out: out["y_pred"])
        >>> _ = store.attach(evaluator, "predictions")
        >>> state = evaluator.run([[1, 2], [3]])
        >>> np.concatenate(state.predictions).tolist()
        [2, 4, 6]
    """

    def __init__(self, output_transform: Callable[[Any], Any] = lambda output: output) -> None:
        if not callable(output_transform):
            raise TypeError(f"`output_transform` must be callable, got {output_transform!r}.")
        self.output_transform = output_transform
        self.data: list[Any] = []
        self.name: str | None = None

    def reset(self) -> None:
        """Start a new list (the stored one, if any, is kept as it was).

        Examples:
            >>> from ember.handlers import EpochOutputStore
            >>> store = EpochOutputStore(); store.data.append(1); store.reset(); store.data
            []
        """
        self.data = []

    def update(self, engine: Engine) -> None:
        """Append this iteration's (transformed) output.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import EpochOutputStore
            >>> engine, store = Engine(lambda e, b: b), EpochOutputStore()
            >>> engine.state.output = 7; store.update(engine); store.data
            [7]
        """
        self.data.append(self.output_transform(engine.state.output))

    def store(self, engine: Engine) -> None:
        """Put `data` on ``engine.state`` under the name given to ``attach``.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import EpochOutputStore
            >>> engine, store = Engine(lambda e, b: b), EpochOutputStore()
            >>> store.name = "outputs"; store.data = [1, 2]; store.store(engine); engine.state.outputs
            [1, 2]
        """
        if self.name is None:
            raise ValueError("EpochOutputStore.store() needs a name: attach it with attach(engine, name=...).")
        setattr(engine.state, self.name, self.data)

    def attach(self, engine: Engine, name: str | None = None) -> RemovableEventHandle:
        """Reset at EPOCH_STARTED, keep each ITERATION_COMPLETED's output, and with ``name`` store at EPOCH_COMPLETED.

        Returns the handle of the per-iteration handler (Ignite's returns nothing).

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import EpochOutputStore
            >>> engine, store = Engine(lambda e, b: b * 10), EpochOutputStore()
            >>> _ = store.attach(engine)
            >>> _ = engine.run([1, 2, 3]); store.data
            [10, 20, 30]
        """
        with collect_handles() as made:
            if name is not None and (not isinstance(name, str) or not name.isidentifier()):
                raise ValueError(f"`name` must be an attribute name for engine.state, got {name!r}.")
            engine.add_event_handler(Events.EPOCH_STARTED, self.reset)
            engine.add_event_handler(Events.ITERATION_COMPLETED, self.update)
            if name:
                self.name = name
                engine.add_event_handler(Events.EPOCH_COMPLETED, self.store)
        return made.handle
