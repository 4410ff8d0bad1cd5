"""`EarlyStopping`: stop the trainer when a score has not improved for ``patience`` calls."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Literal

from ember.engine import Engine, Events, EventsList, FilteredEvent, RemovableEventHandle, collect_handles

log = logging.getLogger("ember")


class EarlyStopping:
    """Calls ``trainer.terminate()`` after ``patience`` calls without improvement of ``score_function``, as Ignite.

    Ignite's arguments and rule (Ignite 0.5.5 names). A score improves when it beats the best so far by more than
    ``threshold``: ``score > best + threshold`` (``mode="max"``) or ``score < best - threshold`` (``"min"``); with
    ``threshold_mode="rel"``, ``score > best * (1 + threshold)`` or ``score < best * (1 - threshold)``. Without
    ``cumulative`` a small gain that does not clear the threshold still becomes the new best (Ignite's default). Usually
    attached to an evaluator's COMPLETED; its counter and best score are in
    [`state_dict`][ember.handlers.EarlyStopping.state_dict], so a resumed run stops where the original would. In a
    multi-process run the score should be a global metric (ember's are), so every process decides the same.

    Args:
        patience: calls without improvement before stopping (at least 1).
        score_function: ``score_function(engine) -> float``, e.g. ``lambda e: e.state.metrics["accuracy"]``.
        trainer: the engine to stop.
        threshold: the least change that counts as an improvement (not negative).
        cumulative: compare with the last improving score instead of the latest best.
        threshold_mode: ``"abs"`` or ``"rel"``: ``threshold`` as an amount, or as a fraction of the best.
        mode: ``"max"`` or ``"min"``.
        min_delta: Ignite's deprecated name of ``threshold`` (it warns, as Ignite does).
        cumulative_delta: Ignite's deprecated name of ``cumulative`` (it warns, as Ignite does).

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
        score_function: Callable[[Engine], float],
        trainer: Engine,
        threshold: float = 0.0,
        cumulative: bool = False,
        threshold_mode: Literal["abs", "rel"] = "abs",
        mode: Literal["min", "max"] = "max",
        *,
        min_delta: float | None = None,
        cumulative_delta: bool | None = None,
    ) -> None:
        if min_delta is not None:  # Ignite's deprecated names, kept as Ignite keeps them (with its warning)
            warnings.warn(
                "'min_delta' is deprecated and will be removed in a future version. Please use 'threshold' instead.",
                DeprecationWarning,
                stacklevel=2,
            )
            threshold = min_delta
        if cumulative_delta is not None:
            warnings.warn(
                "'cumulative_delta' is deprecated and will be removed in a future version. "
                "Please use 'cumulative' instead.",
                DeprecationWarning,
                stacklevel=2,
            )
            cumulative = cumulative_delta
        if not callable(score_function):
            raise TypeError(f"`score_function` must be callable as score_function(engine), got {score_function!r}.")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"`patience` must be an int of at least 1, got {patience!r}.")
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or threshold < 0:
            raise ValueError(f"`threshold` must be a number of at least 0, got {threshold!r}.")
        if not isinstance(trainer, Engine):
            raise TypeError(f"`trainer` must be an ember Engine, got {type(trainer).__name__}.")
        if threshold_mode not in ("abs", "rel"):
            raise ValueError(f'`threshold_mode` must be "abs" or "rel", got {threshold_mode!r}.')
        if mode not in ("min", "max"):
            raise ValueError(f'`mode` must be "min" or "max", got {mode!r}.')
        self.patience, self.score_function, self.trainer = patience, score_function, trainer
        self.threshold, self.cumulative = float(threshold), bool(cumulative)
        self.threshold_mode, self.mode = threshold_mode, mode
        self.counter = 0
        self.best_score: float | None = None

    def __call__(self, engine: Engine) -> None:
        """Score ``engine``; stop the trainer when patience runs out."""
        score = float(self.score_function(engine))
        best = self.best_score
        if best is None:
            self.best_score = score
            return
        step = -self.threshold if self.mode == "min" else self.threshold
        bar = best + step if self.threshold_mode == "abs" else best * (1 + step)
        if score <= bar if self.mode == "max" else score >= bar:
            if not self.cumulative:
                self.best_score = max(score, best) if self.mode == "max" else min(score, best)
            self.counter += 1
            if self.counter >= self.patience:
                log.info("EarlyStopping: no improvement for %d calls; stopping the trainer.", self.counter)
                self.trainer.terminate()
        else:
            self.best_score = score
            self.counter = 0

    def reset(self, engine: Engine | None = None) -> None:
        """Forget the best score and the count, as at the start (Ignite's ``reset``).

        Registered as the reset handler itself (``engine.has_event_handler(stop.reset)`` finds it, and
        ``remove_event_handler(stop.reset, Events.STARTED)`` removes it, as in Ignite); called by an engine's STARTED
        that continues a run (iteration above 0: a resumed checkpoint), it keeps the patience the run had.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import EarlyStopping
            >>> stop = EarlyStopping(3, lambda e: 0.0, Engine(lambda e, b: b))
            >>> stop.counter, stop.best_score = 2, 0.9
            >>> stop.reset(); stop.state_dict()
            {'counter': 0, 'best_score': None}
        """
        if engine is not None and engine.last_event_name is Events.STARTED and engine.state.iteration > 0:
            return  # a run continued (resumed): keep the patience it had
        self.counter, self.best_score = 0, None

    def attach(
        self,
        engine: Engine,
        event: Events | FilteredEvent | EventsList = Events.COMPLETED,
        reset_engine: Engine | None = None,
        reset_event: Events | FilteredEvent | EventsList = Events.STARTED,
    ) -> RemovableEventHandle:
        """Score on ``engine``'s ``event``; reset the count on ``reset_engine``'s ``reset_event``.

        Ignite 0.5.4's ``attach``, with ``reset_engine`` and ``reset_event``.

        Two deliberate differences from Ignite (``docs/concepts/events.md`` lists them): ``reset_engine``
        defaults to the ``trainer``, not to ``engine`` (Ignite's default resets at every evaluation when
        ``engine`` is an evaluator, so its patience never runs out); and a STARTED that continues a run
        (a resumed checkpoint, a second ``run()`` after ``terminate()``: iteration above 0) keeps the counter
        and best score, so a restored patience is not thrown away. A new run from iteration 0 starts afresh.

        Args:
            engine: where the score is read, usually an evaluator.
            event: ``engine``'s event to score on.
            reset_engine: the engine whose ``reset_event`` resets the count; ``None``: the trainer.
            reset_event: the event that resets it.

        Returns:
            The handle of the scoring handler.

        Examples:
            >>> from ember import Engine, Events
            >>> from ember.handlers import EarlyStopping
            >>> trainer, evaluator = Engine(lambda e, b: b), Engine(lambda e, b: b)
            >>> stop = EarlyStopping(2, lambda e: -e.state.output, trainer)
            >>> _ = stop.attach(evaluator)
            >>> _ = trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: evaluator.run([1]))
            >>> trainer.run([0], max_epochs=10).epoch
            3
            >>> trainer.state.max_epochs = None  # a new run, from iteration 0: the patience starts afresh
            >>> trainer.run([0], max_epochs=10).epoch, stop.counter
            (3, 2)
        """
        with collect_handles() as made:
            engine.add_event_handler(event, self)
            (reset_engine or self.trainer).add_event_handler(reset_event, self.reset)
        return made.handle

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
