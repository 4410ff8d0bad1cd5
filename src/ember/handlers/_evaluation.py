"""`Evaluate`: run an evaluator on validation data on a trainer's schedule and report under a label."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from ember.engine import Engine, Events, EventsList, FilteredEvent, RemovableEventHandle, collect_handles
from ember.handlers._reporting.loggers import ScalarLogger, as_async
from ember.writers import Writer


class Evaluate:
    """Runs ``evaluator`` over ``data`` when the trainer's event fires; writes its metrics as ``tag/name``.

    Metrics are written at the trainer's iteration, so validation curves line up with training ones.
    The evaluator's own handlers (early stopping, a best-checkpoint saver on its COMPLETED) run as usual.
    `history` keeps ``(trainer iteration, metrics)`` of every evaluation. An evaluation cut short (its evaluator
    terminated with ``skip_completed``, as [`Preemption`][ember.handlers.Preemption] does) records, writes and
    publishes nothing (the evaluator's metrics are still the last whole evaluation's); it is `owed`, and the trainer's
    next run makes it up first, at its STARTED (or at the EPOCH_COMPLETED it fires again). Fired twice at one trainer
    iteration (a schedule of two events due at once: ``EPOCH_COMPLETED | ITERATION_COMPLETED(every=N)`` where an
    epoch ends on a multiple of N, or ``EPOCH_COMPLETED | COMPLETED``), it evaluates once: the model is the same.

    When the trainer starts, an evaluator from [`create_evaluator`][ember.training.create_evaluator] compiles its step
    on a thread of its own ([`precompile`][ember.training.TrainingEngine.precompile]) while the trainer compiles and
    trains, so the first evaluation does not wait for XLA; it needs the data's first batch without iterating it (an
    [`ArrayDataset`][ember.data.ArrayDataset]'s ``peek()``, or a list's first item); other data compiles at the first
    evaluation, as does everything with ``precompile=False``.

    Args:
        evaluator: the engine to run (from [`create_evaluator`][ember.training.create_evaluator]).
        data: validation data, iterated from the start at every evaluation.
        writer: where the metrics go (wrapped in an ``AsyncWriter``); ``None`` to write nothing.
        tag: the label in front of every metric name.
        precompile: compile the evaluator's step in the background when the trainer starts.
        publish: also put the metrics in the trainer's ``state.metrics`` as ``tag/name``, where the trainer's
            handlers find them (a `Checkpoint` with ``score_name="val/accuracy"``); what
            [`Evaluations`][ember.handlers.Evaluations] does.

    Examples:
        >>> from ember import Engine, Events
        >>> from ember.handlers import Evaluate
        >>> trainer, evaluator = Engine(lambda e, b: b), Engine(lambda e, b: b)
        >>> _ = evaluator.add_event_handler(Events.COMPLETED, lambda e: e.state.metrics.update(last=e.state.output))
        >>> evaluate = Evaluate(evaluator, [1.0, 3.0])
        >>> _ = evaluate.attach(trainer, Events.EPOCH_COMPLETED)
        >>> _ = trainer.run([0, 0], max_epochs=2); evaluate.history
        [(2, {'last': 3.0}), (4, {'last': 3.0})]
    """

    def __init__(
        self,
        evaluator: Engine,
        data: Iterable[Any],
        *,
        writer: Writer | None = None,
        tag: str = "val",
        precompile: bool = True,
        publish: bool = False,
    ):
        if not isinstance(evaluator, Engine):
            raise TypeError(f"`evaluator` must be an ember Engine, got {type(evaluator).__name__}.")
        if writer is not None and not isinstance(writer, Writer):
            raise TypeError(f"`writer` must be an ember.writers.Writer or None, got {type(writer).__name__}.")
        for arg, value in (("precompile", precompile), ("publish", publish)):
            if not isinstance(value, bool):
                raise TypeError(f"`{arg}` must be True or False, got {value!r}.")
        self.evaluator, self.data, self.writer, self.tag = evaluator, data, writer, tag
        self.publish = publish
        self.history: list[tuple[int, dict[str, Any]]] = []
        self._ahead: Future[bool] | None = None  # the evaluator's step compiling in the background
        self._precompiled = not precompile
        self._logger: ScalarLogger | None = None
        #: ``(trainer iteration, event)`` of an evaluation cut short, which the trainer's next run makes up first
        self.owed: tuple[int, str] | None = None
        self._evaluated_at: int | None = None  # the trainer iteration evaluated at in this run (reset at STARTED)

    def _start_compiling(self) -> None:
        """At the trainer's STARTED: compile the evaluator's step on a thread of its own, once."""
        precompile: Callable[..., Future[bool]] | None = getattr(self.evaluator, "precompile", None)
        if self._precompiled or not callable(precompile):
            return
        self._precompiled = True
        batch = _first_batch(self.data)
        if batch is not None:
            self._ahead = precompile(batch, background=True)

    def __call__(self, trainer: Engine) -> None:
        """Evaluate now; write and remember the metrics."""
        if self._ahead is not None:  # done long ago, in practice; a failure shows again in the run, in context
            ahead, self._ahead = self._ahead, None
            ahead.exception()
        if self._evaluated_at == trainer.state.iteration:
            return  # two events of its schedule at one iteration (every epoch and every N iterations): the same model
        event = trainer.last_event_name
        self.evaluator.run(self.data)
        if self.evaluator.should_terminate == "skip_completed":  # cut short (a preemption): owed, recorded nowhere
            if self.owed is None or self.owed[0] != trainer.state.iteration:  # a make-up cut short stays as owed
                self.owed = (trainer.state.iteration, str(getattr(event, "value", event)))
            return
        self.owed = None
        self._evaluated_at = trainer.state.iteration
        metrics = dict(self.evaluator.state.metrics)
        self.history.append((trainer.state.iteration, metrics))
        if self.publish:
            trainer.state.metrics.update({f"{self.tag}/{k}": v for k, v in metrics.items()})
        if self.writer is not None:
            if self._logger is None:  # one logger for every evaluation: an array metric it leaves out is said once
                step = lambda *_: trainer.state.iteration  # noqa: E731
                self._logger = ScalarLogger(self.writer, tag=self.tag, global_step_transform=step)
            self._logger(self.evaluator)

    def _make_up(self, trainer: Engine) -> None:
        """At the trainer's STARTED: the evaluation cut short at this iteration runs first, whole.

        One cut at EPOCH_COMPLETED waits for that event: the resumed run fires it again (`Preemption` marks it).
        """
        self._evaluated_at = None  # a new run: its iterations are evaluated afresh (folds restart at 0)
        if self.owed is None or self.owed[1] == Events.EPOCH_COMPLETED.value:
            return
        if self.owed[0] == trainer.state.iteration:
            self(trainer)
        else:  # the run goes on from elsewhere (an older checkpoint): nothing is owed there
            self.owed = None

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint of the trainer keeps of this evaluation: the one owed, if any (`owed`).

        [`Evaluations`][ember.handlers.Evaluations] saves it with the trainer (``trainer.track_state``), so an
        evaluation a preemption cut short is made up, whole, at the start of the resumed run.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import Evaluate
            >>> evaluate = Evaluate(Engine(lambda e, b: b), [1])
            >>> evaluate.state_dict()
            {'owed': None}
            >>> evaluate.load_state_dict({"owed": [4, "iteration_completed"]}); evaluate.owed
            (4, 'iteration_completed')
        """
        return {"owed": list(self.owed) if self.owed is not None else None}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Take back what [`state_dict`][ember.handlers.Evaluate.state_dict] saved."""
        owed = state_dict.get("owed") if isinstance(state_dict, Mapping) else ()
        if owed is not None and not (
            isinstance(owed, list) and len(owed) == 2 and isinstance(owed[0], int) and isinstance(owed[1], str)
        ):
            raise ValueError(
                f"`state_dict` of Evaluate must hold 'owed': [iteration, event] or None, got {state_dict!r}."
            )
        self.owed = (owed[0], owed[1]) if owed is not None else None

    def attach(
        self,
        trainer: Engine,
        event: Events | FilteredEvent | EventsList = Events.EPOCH_COMPLETED,
        *,
        first: bool = False,
    ) -> RemovableEventHandle:
        """Evaluate on the trainer's ``event`` (every epoch by default; ``ITERATION_COMPLETED(every=N)``...).

        ``first=True`` evaluates before the trainer's other handlers of that event (after its metrics are computed),
        whenever they were attached: a checkpoint or an early stop at the event then sees this evaluation.

        Examples:
            >>> from ember import Engine, Events
            >>> from ember.handlers import Evaluate
            >>> trainer, evaluator = Engine(lambda e, b: b), Engine(lambda e, b: b)
            >>> handle = Evaluate(evaluator, [1, 2]).attach(trainer, Events.EPOCH_COMPLETED(every=2))
        """
        with collect_handles() as made:
            trainer.add_event_handler(Events.STARTED, self._start_compiling)
            trainer.add_event_handler(Events.STARTED, self._make_up)
            (trainer.add_priority_handler if first else trainer.add_event_handler)(event, self)
            if self.writer is not None:
                self.writer = as_async(self.writer, trainer)
        return made.handle


def _first_batch(data: Iterable[Any]) -> Any:
    """The first batch of ``data`` if it can be had without iterating (which would move a dataset on), else ``None``."""
    peek = getattr(data, "peek", None)
    if callable(peek):
        return peek()
    if isinstance(data, Sequence) and len(data) > 0:
        return data[0]
    return None
