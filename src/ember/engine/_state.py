"""`State`: the counters and values an engine shares with its handlers."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any


class State:
    """What an [`Engine`][ember.engine.Engine] knows about its run, read and written by handlers.

    Counters are Python ints, 1-based once running: the first iteration is 1, the first epoch is 1. Handlers may add
    their own attributes (``engine.state.best_score = ...``); list the ones a checkpoint must carry in
    [`Engine.state_dict_user_keys`][ember.engine.Engine.state_dict_user_keys].

    Attributes:
        iteration: iterations run so far, over all epochs.
        epoch: the current epoch (the one in progress, or the last one completed).
        epoch_length: iterations per epoch; ``None`` until known for data of unknown length.
        max_epochs: the epoch at which the run ends.
        max_iters: the iteration at which the run ends, when the run was given ``max_iters``.
        output: what the process function returned for the current iteration, untouched.
        batch: the current batch.
        metrics: values written by metrics, by name: host numbers once computed, 0-d device arrays while
            only published every step (``RunningAverage``); ``float(v)`` and ``f"{v:.4f}"`` take either.
        dataloader: the data the engine iterates: an [`Engine`][ember.engine.Engine]'s is the data passed to ``run()``;
            a trainer's or evaluator's wraps it to put batches on the device (the data passed is its ``source``).
        times: seconds taken by the last epoch (``"EPOCH_COMPLETED"``) and by the run
            (``"COMPLETED"``), including handlers.

    Ignite's ``state.seed`` has no counterpart: randomness in ember is JAX keys, carried in the train state
    (``TrainState.from_linen(..., seed=)``) and folded with the step, so a resumed run draws what an
    uninterrupted one would without a global seed.

    Args:
        **kwargs: attributes to set after the defaults, as Ignite's ``State(**kwargs)``:
            ``State(iteration=3, epoch=1)``.

    Examples:
        >>> from ember import Engine, State
        >>> state = Engine(lambda engine, batch: batch).run([1, 2, 3], max_epochs=2)
        >>> state.iteration, state.epoch, state.epoch_length, state.output
        (6, 2, 3, 3)
        >>> print(State(iteration=3, epoch=1, loss=0.5), end="")  # Ignite's repr
        State:
            iteration: 3
            epoch: 1
            epoch_length: <class 'NoneType'>
            max_epochs: <class 'NoneType'>
            max_iters: <class 'NoneType'>
            output: <class 'NoneType'>
            batch: <class 'NoneType'>
            metrics: <class 'dict'>
            dataloader: <class 'NoneType'>
            times: <class 'dict'>
            loss: 0.5
    """

    def __init__(self, **kwargs: Any) -> None:
        self.iteration: int = 0
        self.epoch: int = 0
        self.epoch_length: int | None = None
        self.max_epochs: int | None = None
        self.max_iters: int | None = None
        self.output: Any = None
        self.batch: Any = None
        self.metrics: dict[str, Any] = {}
        self.dataloader: Iterable[Any] | None = None
        self.times: dict[str, float | None] = {"EPOCH_COMPLETED": None, "COMPLETED": None}
        for k, v in kwargs.items():
            setattr(self, k, v)

    def __repr__(self) -> str:
        """Ignite's: each attribute on a line, a value that is not a number or a string shown by its type."""
        lines = ["State:"]
        for name, value in vars(self).items():
            if not name.startswith("_"):
                shown = value if isinstance(value, numbers.Number | str) else type(value)
                lines.append(f"\t{name}: {shown}")
        return "\n".join(lines) + "\n"
