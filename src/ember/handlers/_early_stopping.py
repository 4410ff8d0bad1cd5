"""`EarlyStopping`: stop the trainer when a score has not improved for ``patience`` calls."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal

from ember.engine import Engine, Events, EventsList, FilteredEvent, RemovableEventHandle

log = logging.getLogger("ember")


class EarlyStopping:
    """Calls ``trainer.terminate()`` after ``patience`` calls without improvement of ``score_fn``, as Ignite.

    A score improves when it beats the best so far by more than ``min_delta`` (``mode="max"``: higher is
    better; ``"min"``: lower). Without ``cumulative_delta`` a small gain that does not clear ``min_delta``
    still becomes the new best (Ignite's default). Usually attached to an evaluator's COMPLETED; its
    counter and best score are in :meth:`state_dict`, so a resumed run stops where the original would.
    In a multi-process run the score should be a global metric (ember's are), so every process decides
    the same.

    Args:
        patience: calls without improvement before stopping (at least 1).
        score_fn: ``score_fn(engine) -> float``, e.g. ``lambda e: e.state.metrics["accuracy"]``.
        trainer: the engine to stop.
        min_delta: the least change that counts as an improvement (not negative).
        cumulative_delta: compare with the last improving score instead of the latest best.
        mode: ``"max"`` or ``"min"``.

    Examples:
        >>> from ember import Engine, Events
        >>> from ember.handlers import EarlyStopping
        >>> trainer = Engine(lambda e, b: b)
        >>> scores = iter([1.0, 0.8, 0.88, 0.9])
        >>> stop = EarlyStopping(2, lambda e: next(scores), trainer)
        >>> _ = trainer.add_event_handler(Events.EPOCH_COMPLETED, stop)
        >>> trainer.run([0], max_epochs=10).epoch, stop.counter
        (3, 2)
    """

    def __init__(
        self,
        patience: int,
        score_fn: Callable[[Engine], float],
        trainer: Engine,
        *,
        min_delta: float = 0.0,
        cumulative_delta: bool = False,
        mode: Literal["min", "max"] = "max",
    ) -> None:
        if not callable(score_fn):
            raise TypeError(f"`score_fn` must be callable as score_fn(engine), got {score_fn!r}.")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"`patience` must be an int of at least 1, got {patience!r}.")
        if isinstance(min_delta, bool) or not isinstance(min_delta, int | float) or min_delta < 0:
            raise ValueError(f"`min_delta` must be a number of at least 0, got {min_delta!r}.")
        if not isinstance(trainer, Engine):
            raise TypeError(f"`trainer` must be an ember Engine, got {type(trainer).__name__}.")
        if mode not in ("min", "max"):
            raise ValueError(f'`mode` must be "min" or "max", got {mode!r}.')
        self.patience, self.score_fn, self.trainer = patience, score_fn, trainer
        self.min_delta, self.cumulative_delta, self.mode = float(min_delta), bool(cumulative_delta), mode
        self.counter = 0
        self.best_score: float | None = None

    def __call__(self, engine: Engine) -> None:
        """Score ``engine``; stop the trainer when patience runs out."""
        score = float(self.score_fn(engine))
        if self.mode == "min":
            score = -score
        if self.best_score is None:
            self.best_score = score
        elif score <= self.best_score + self.min_delta:
            if not self.cumulative_delta and score > self.best_score:
                self.best_score = score
            self.counter += 1
            if self.counter >= self.patience:
                log.info("EarlyStopping: no improvement for %d calls; stopping the trainer.", self.counter)
                self.trainer.terminate()
        else:
            self.best_score = score
            self.counter = 0

    def attach(
        self, engine: Engine, event: Events | FilteredEvent | EventsList = Events.COMPLETED
    ) -> RemovableEventHandle:
        """Score on ``engine``'s ``event`` (an evaluator's COMPLETED by default).

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import EarlyStopping
            >>> trainer, evaluator = Engine(lambda e, b: b), Engine(lambda e, b: b)
            >>> stop = EarlyStopping(3, lambda e: e.state.output, trainer)
            >>> handle = stop.attach(evaluator)
        """
        return engine.add_event_handler(event, self)

    def state_dict(self) -> dict[str, Any]:
        """The counter and best score.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import EarlyStopping
            >>> EarlyStopping(3, lambda e: 0.0, Engine(lambda e, b: b)).state_dict()
            {'counter': 0, 'best_score': None}
        """
        return {"counter": self.counter, "best_score": self.best_score}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the counter and best score.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import EarlyStopping
            >>> stop = EarlyStopping(3, lambda e: 0.0, Engine(lambda e, b: b))
            >>> stop.load_state_dict({"counter": 2, "best_score": 0.9}); stop.counter
            2
        """
        missing = {"counter", "best_score"} - set(state_dict)
        if missing:
            raise KeyError(f"EarlyStopping state_dict lacks {sorted(missing)}; got keys {sorted(state_dict)}.")
        self.counter = int(state_dict["counter"])
        best = state_dict["best_score"]
        self.best_score = None if best is None else float(best)
