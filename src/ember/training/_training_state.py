"""`TrainingState`: the engine's state, with the train state the compiled step runs on."""

from __future__ import annotations

from typing import Any

import jax

from ember.engine import State
from ember.training._train_state import TrainState


class TrainingState(State):
    """The [`State`][ember.engine.State] of a training engine, plus the train state it runs the step on.

    Attributes:
        train_state: the current [`TrainState`][ember.training.TrainState] (on device); ``None`` until built for a lazy
            state.

    Examples:
        >>> from ember.training import TrainingState
        >>> TrainingState().train_state is None
        True
    """

    def __init__(self) -> None:
        super().__init__()
        self.train_state: Any = None


NOT_BUILT = (
    "This trainer has no train state yet: it builds it from the first batch. To resume before the first run, "
    "build it from a sample first: trainer.build_state(next(iter(data))), then Checkpoint.resume() or load_objects()."
)


def build_state(factory: Any, batch: Any) -> TrainState:
    """The train state ``factory`` builds from ``batch`` (on the host), refused unless it is a `TrainState`."""
    built = factory(jax.device_get(batch)) if not isinstance(factory, TrainState) else factory
    if not isinstance(built, TrainState):
        raise TypeError(f"The state factory must return a TrainState, got {type(built).__name__}.")
    return built
