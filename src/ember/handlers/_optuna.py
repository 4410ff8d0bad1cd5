"""`OptunaPruning`: report an evaluator's metric to an Optuna trial each epoch, and stop a trial it prunes."""

from __future__ import annotations

from typing import Any

from ember._extras import missing
from ember.engine import Engine, Events, RemovableEventHandle


class OptunaPruning:
    """Optuna's pruning for an ember run, as Optuna's own Ignite integration (``PyTorchIgnitePruningHandler``).

    Attached to an evaluator's COMPLETED, it reports ``evaluator.state.metrics[metric]`` to ``trial`` at the
    trainer's epoch; when the study's pruner says so it raises ``optuna.TrialPruned``, which ends the run and
    tells the study the trial was pruned. Needs ``pip install -e ".[optuna]"``.

    Args:
        trial: the ``optuna.Trial`` the objective function was given.
        metric: the evaluator's metric to report (the study's direction says whether higher is better).
        trainer: the engine whose epoch is the step of each report.

    Examples:
        >>> import optuna
        >>> from ember import Engine, Events
        >>> from ember.handlers import OptunaPruning
        >>> def objective(trial):
        ...     trainer, evaluator = Engine(lambda e, b: b), Engine(lambda e, b: b)
        ...     evaluator.add_event_handler(Events.COMPLETED, lambda e: e.state.metrics.update(loss=1.0))
        ...     OptunaPruning(trial, "loss", trainer).attach(evaluator)
        ...     trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: evaluator.run([0]))
        ...     trainer.run([0], max_epochs=3)
        ...     return evaluator.state.metrics["loss"]
        >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
        >>> study = optuna.create_study()
        >>> study.optimize(objective, n_trials=1)
        >>> study.trials[0].intermediate_values
        {1: 1.0, 2: 1.0, 3: 1.0}
    """

    def __init__(self, trial: Any, metric: str, trainer: Engine) -> None:
        try:
            import optuna
        except ImportError as e:
            raise ImportError(missing("OptunaPruning", "optuna", "optuna")) from e
        if not isinstance(trial, optuna.trial.BaseTrial):
            raise TypeError(f"`trial` must be an optuna Trial, got {type(trial).__name__}.")
        if not isinstance(trainer, Engine):
            raise TypeError(f"`trainer` must be an ember Engine, got {type(trainer).__name__}.")
        self.trial, self.metric, self.trainer = trial, metric, trainer
        self._pruned = optuna.TrialPruned

    def __call__(self, evaluator: Engine) -> None:
        """Report the metric at the trainer's epoch; raise ``optuna.TrialPruned`` if the pruner says so."""
        metrics = evaluator.state.metrics
        if self.metric not in metrics:
            raise KeyError(f"OptunaPruning reports {self.metric!r}; the evaluator's metrics are {sorted(metrics)}.")
        epoch = self.trainer.state.epoch
        self.trial.report(float(metrics[self.metric]), epoch)
        if self.trial.should_prune():
            raise self._pruned(f"Trial was pruned at epoch {epoch}.")

    def attach(self, evaluator: Engine) -> RemovableEventHandle:
        """Report at each of the evaluator's COMPLETED; return the handle (see the class example)."""
        return evaluator.add_event_handler(Events.COMPLETED, self)
