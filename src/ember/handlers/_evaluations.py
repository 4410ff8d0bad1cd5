"""`Evaluations`: a run's named evaluations, each with its data and schedule, published under its name."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ember.engine import Engine, Events, EventsList, FilteredEvent, RemovableEventHandle, collect_handles
from ember.handlers._evaluation import Evaluate
from ember.metrics._attach import published_values
from ember.writers import Writer

Schedule = Events | FilteredEvent | EventsList


class Evaluations:
    """A run's named evaluations: each an evaluator, its data and its schedule on the trainer.

    Each evaluation's metrics are published under its name, ``name/metric`` (``"val_noisy/accuracy"``): in the
    trainer's ``state.metrics`` (so a [`Checkpoint`][ember.handlers.Checkpoint] on the trainer, with
    ``score_name="val_noisy/accuracy"`` or [`score`][ember.handlers.Evaluations.score], keeps the best of any of
    them), in each one's `history`, and through ``writer`` at the trainer's iteration. A schedule is one of the
    trainer's events, with Ignite's filters: ``ITERATION_COMPLETED(every=500)``, ``EPOCH_COMPLETED(every=2)``,
    ``ITERATION_COMPLETED(every_secs=600)``, ``ITERATION_COMPLETED(once=1000)``, ``COMPLETED`` (at the end).

    Order: at an event where an evaluation and other handlers of the trainer are due, the evaluations run first
    (in the order they were added, after the trainer's own metrics are computed), so a checkpoint or an early stop
    at that event sees this step's numbers.

    Args:
        trainer: the engine whose events schedule the evaluations.
        writer: where every evaluation's metrics go, as ``name/metric`` (``None``: nowhere but ``state.metrics``).

    Examples:
        >>> from ember import Engine, Events
        >>> from ember.handlers import Evaluations
        >>> from ember.metrics import Average
        >>> trainer = Engine(lambda e, b: b)
        >>> clean, noisy = Engine(lambda e, b: b), Engine(lambda e, b: b)
        >>> _ = Average().attach(clean, "mean"); _ = Average().attach(noisy, "mean")
        >>> evaluations = Evaluations(trainer)
        >>> _ = evaluations.add("clean", clean, [1.0, 2.0], Events.EPOCH_COMPLETED)
        >>> _ = evaluations.add("noisy", noisy, [5.0], Events.ITERATION_COMPLETED(every=3))
        >>> trainer.run([0, 0], max_epochs=3).metrics
        {'clean/mean': 1.5, 'noisy/mean': 5.0}
        >>> evaluations["clean"].history[0], evaluations["noisy"].history
        ((2, {'mean': 1.5}), [(3, {'mean': 5.0}), (6, {'mean': 5.0})])
    """

    def __init__(self, trainer: Engine, *, writer: Writer | None = None) -> None:
        if not isinstance(trainer, Engine):
            raise TypeError(f"`trainer` must be an ember Engine, got {type(trainer).__name__}.")
        if writer is not None and not isinstance(writer, Writer):
            raise TypeError(f"`writer` must be an ember.writers.Writer or None, got {type(writer).__name__}.")
        self.trainer, self.writer = trainer, writer
        self._added: dict[str, tuple[Evaluate, RemovableEventHandle]] = {}
        # the numbers published in the trainer's state.metrics are saved with it, as its own metrics' are
        trainer.track_state("state.metrics", published_values(trainer))

    def add(
        self,
        name: str,
        evaluator: Engine,
        data: Iterable[Any],
        schedule: Schedule = Events.EPOCH_COMPLETED,
        *,
        precompile: bool = True,
    ) -> Evaluate:
        """Evaluate ``evaluator`` over ``data`` on the trainer's ``schedule``; publish its metrics as ``name/metric``.

        Returns its [`Evaluate`][ember.handlers.Evaluate] (``history`` holds every evaluation).

        Raises:
            ValueError: ``name`` is empty, holds ``/``, or is taken by another evaluation of this run.
            TypeError: ``schedule`` is not an event of the trainer (``Events.X``, ``Events.X(every=...)``, ``|``).

        Examples:
            >>> from ember import Engine, Events
            >>> from ember.handlers import Evaluations
            >>> evaluations = Evaluations(Engine(lambda e, b: b))
            >>> _ = evaluations.add("val", Engine(lambda e, b: b), [1])
            >>> evaluations.add("val", Engine(lambda e, b: b), [2])
            Traceback (most recent call last):
            ...
            ValueError: `name` 'val' is taken: this run already evaluates 'val'; give each evaluation its own name.
        """
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"`name` must be a non-empty string without '/', got {name!r}.")
        if name in self._added:
            raise ValueError(
                f"`name` {name!r} is taken: this run already evaluates {name!r}; give each evaluation its own name."
            )
        if not isinstance(schedule, Events | FilteredEvent | EventsList):
            raise TypeError(
                "`schedule` must be an event of the trainer (Events.EPOCH_COMPLETED, "
                f"Events.ITERATION_COMPLETED(every=500), Events.COMPLETED, ...), got {schedule!r}."
            )
        evaluate = Evaluate(evaluator, data, writer=self.writer, tag=name, precompile=precompile, publish=True)
        with collect_handles() as made:
            evaluate.attach(self.trainer, schedule, first=True)
            made.on_remove(self.trainer.track_state(f"evaluation:{name}", evaluate))  # an evaluation owed, if cut
        self._added[name] = (evaluate, made.handle)
        return evaluate

    def __getitem__(self, name: str) -> Evaluate:
        """The evaluation named ``name``."""
        if name not in self._added:
            raise KeyError(f"No evaluation is named {name!r}; this run evaluates {self.names}.")
        return self._added[name][0]

    @property
    def names(self) -> list[str]:
        """The evaluations' names, in the order they were added.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import Evaluations
            >>> evaluations = Evaluations(Engine(lambda e, b: b))
            >>> _ = evaluations.add("clean", Engine(lambda e, b: b), [1])
            >>> _ = evaluations.add("noisy", Engine(lambda e, b: b), [1])
            >>> evaluations.names
            ['clean', 'noisy']
        """
        return list(self._added)

    def score(self, metric: str) -> Callable[[Engine], float]:
        """A score function reading ``"name/metric"`` from the trainer, for `Checkpoint`, `EarlyStopping`, Optuna.

        The evaluation's name is checked now; the metric when the score is first read, against what that
        evaluation published.

        Raises:
            ValueError: ``metric`` is not ``"name/metric"`` with the name of an evaluation of this run.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import Evaluations
            >>> evaluations = Evaluations(Engine(lambda e, b: b))
            >>> _ = evaluations.add("clean", Engine(lambda e, b: b), [1])
            >>> evaluations.score("noisy/accuracy")
            Traceback (most recent call last):
            ...
            ValueError: `metric` 'noisy/accuracy' names no evaluation of this run: it evaluates ['clean'].
        """
        name, _, key = metric.partition("/") if isinstance(metric, str) else ("", "", "")
        if not key:
            raise ValueError(f"`metric` must be 'name/metric' (e.g. 'val/accuracy'), got {metric!r}.")
        if name not in self._added:
            raise ValueError(f"`metric` {metric!r} names no evaluation of this run: it evaluates {self.names}.")
        evaluate = self._added[name][0]

        def score(engine: Engine) -> float:
            metrics = self.trainer.state.metrics
            if metric not in metrics:
                published = sorted(k for k in metrics if k.startswith(f"{name}/"))
                raise KeyError(
                    f"The score {metric!r} was read before {name!r} published it (it has published {published}, "
                    f"{len(evaluate.history)} evaluations so far): schedule the evaluation at or before the score."
                )
            return float(metrics[metric])

        return score

    def remove(self) -> None:
        """Detach every evaluation from the trainer.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import Evaluations
            >>> trainer = Engine(lambda e, b: b)
            >>> evaluations = Evaluations(trainer)
            >>> _ = evaluations.add("val", Engine(lambda e, b: b), [1]); evaluations.remove()
            >>> trainer.run([0]).metrics, evaluations.names
            ({}, [])
        """
        for _, handle in self._added.values():
            handle.remove()
        self._added.clear()
