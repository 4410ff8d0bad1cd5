"""`RollbackOnDivergence`: after a run of skipped updates, back to the last checkpoint before them, past their data."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ember.checkpoint import CorruptCheckpointError
from ember.engine import Engine, Events, RemovableEventHandle, collect_handles
from ember.handlers._checkpointing.checkpoint import Checkpoint
from ember.handlers._checkpointing.loading import load_objects
from ember.handlers._reporting.late import OneStepLate

log = logging.getLogger(__name__)

#: The skip reasons of ``StepGuard`` (``create_trainer(skip_nonfinite=True)``), by the step's ``skip_reason``.
REASONS = {1: "a non-finite loss", 2: "a non-finite gradient", 3: "a loss spike", 4: "a gradient-norm spike"}


@dataclass(frozen=True)
class Rollback:
    """One rollback: the skipped steps that set it off, the checkpoint restored, the data left out, and why.

    Attributes:
        skipped: the iterations whose updates were skipped in a row (first, last).
        restored: the trainer iteration of the checkpoint restored.
        dropped: the iterations whose batches the run went past (first, last): every one since the checkpoint.
        reason: why the last skipped step was skipped.

    Examples:
        >>> from ember.handlers import Rollback
        >>> print(Rollback((18, 20), 16, (17, 21), "a non-finite loss"))  # doctest: +NORMALIZE_WHITESPACE
        Rolled back to the checkpoint of iteration 16 after 3 skipped steps in a row (iterations 18-20, the last for
        a non-finite loss); the batches of iterations 17-21 are left out.
    """

    skipped: tuple[int, int]
    restored: int
    dropped: tuple[int, int]
    reason: str

    def __str__(self) -> str:
        return (
            f"Rolled back to the checkpoint of iteration {self.restored} after {self.skipped[1] - self.skipped[0] + 1} "
            f"skipped steps in a row (iterations {self.skipped[0]}-{self.skipped[1]}, the last for {self.reason}); "
            f"the batches of iterations {self.dropped[0]}-{self.dropped[1]} are left out."
        )


class _TreeOnly:
    """The trainer's train state alone: a rollback restores it and leaves the counters and the data where they are."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def tree_state_dict(self) -> dict[str, Any]:
        return self.trainer.tree_state_dict()

    def load_tree_state_dict(self, tree: dict[str, Any]) -> None:
        self.trainer.load_tree_state_dict(tree)


class RollbackOnDivergence:
    """Restores the trainer's state from the last checkpoint before ``after`` skipped updates in a row, and trains on.

    Needs ``create_trainer(..., skip_nonfinite=True)`` (optionally with ``spike_factor``), whose step skips an update
    with a non-finite loss or gradient (or a spike) and reports ``consecutive_skips``. That count is read one
    iteration late, as `TerminateOnNan` reads its flag, so the check never stalls the step. Once it reaches
    ``after``, the newest checkpoint of ``checkpoint`` saved before the first skipped step is loaded into the train
    state (parameters, optimizer state, step counter), while the engine's counters and the data position stay where
    they are: the batches since that checkpoint, the window that diverged, are left out. Each rollback is logged
    (a warning naming the steps, the data range and the reason) and kept in `rollbacks`. If the run diverges again
    before a newer checkpoint exists, so that it would go back to the same one, it stops with a `RuntimeError`
    naming both windows.

    Args:
        checkpoint: the [`Checkpoint`][ember.handlers.Checkpoint] that saves the trainer (ember's store).
        after: skipped steps in a row that set off a rollback.

    Examples:
        >>> import tempfile, jax.numpy as jnp, numpy as np, optax
        >>> from ember import Events
        >>> from ember.handlers import Checkpoint, RollbackOnDivergence
        >>> from ember.training import TrainState, create_trainer
        >>> state = TrainState.create(lambda p, x: x @ p, jnp.zeros((2, 1)), optax.sgd(0.1))
        >>> trainer = create_trainer(state, lambda m, x: jnp.mean((m(x) - 1.0) ** 2), skip_nonfinite=True)
        >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp(), n_saved=None)
        >>> _ = saver.attach(trainer, Events.ITERATION_COMPLETED(every=2))
        >>> rollback = RollbackOnDivergence(saver, after=2)
        >>> _ = rollback.attach(trainer)
        >>> data = [np.ones((4, 2), np.float32)] * 8
        >>> data[4] = data[5] = np.full((4, 2), np.nan, np.float32)
        >>> _ = trainer.run(data)
        >>> rollback.rollbacks[0].skipped, rollback.rollbacks[0].restored, rollback.rollbacks[0].dropped
        ((5, 6), 4, (5, 7))
    """

    def __init__(self, checkpoint: Checkpoint, *, after: int = 3) -> None:
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"`checkpoint` must be an ember.handlers.Checkpoint, got {type(checkpoint).__name__}.")
        if checkpoint.store is None:
            raise ValueError("`checkpoint` must write to an ember store (a folder), not a save handler of yours.")
        if not isinstance(after, int) or isinstance(after, bool) or after < 1:
            raise ValueError(f"`after` must be an int >= 1, got {after!r}.")
        self.checkpoint, self.after = checkpoint, after
        self.rollbacks: list[Rollback] = []
        self._late = OneStepLate()

    def _name_of(self, trainer: Engine) -> str:
        for name, obj in self.checkpoint.to_save.items():
            if obj is trainer:
                return name
        raise ValueError(
            f"The checkpoint does not save this trainer: its to_save holds {sorted(self.checkpoint.to_save)}; "
            'pass Checkpoint({"trainer": trainer, ...}, ...).'
        )

    def __call__(self, engine: Engine) -> None:
        """Push this iteration's count of skipped steps; act on the previous iteration's."""
        out = engine.state.output
        if not isinstance(out, dict) or "consecutive_skips" not in out:
            raise KeyError(
                "RollbackOnDivergence reads the step's 'consecutive_skips'; build the trainer with "
                "create_trainer(..., skip_nonfinite=True)."
            )
        self._act(engine, self._late.push(engine.state.iteration, (out["consecutive_skips"], out["skip_reason"])))

    def _act(self, engine: Engine, read: tuple[int, Any] | None) -> None:
        if read is None:
            return
        iteration, (consecutive, reason) = read
        consecutive = int(consecutive)
        if consecutive < self.after:
            return
        first = iteration - consecutive + 1
        self.checkpoint.wait()  # a save in flight is on disk first
        store = self.checkpoint.store
        assert store is not None  # checked when made
        why = REASONS.get(int(reason), f"reason {int(reason)}")
        for info in sorted((i for i in store.ranked() if i.step < first), key=lambda i: i.step, reverse=True):
            if any(r.restored == info.step for r in self.rollbacks):
                earlier = next(r for r in self.rollbacks if r.restored == info.step)
                raise RuntimeError(
                    f"The run diverged again after rolling back to the checkpoint of iteration {info.step}: "
                    f"iterations {first}-{iteration} were skipped ({why}), after iterations {earlier.skipped[0]}-"
                    f"{earlier.skipped[1]} the first time; stopping instead of rolling back over the same window."
                )
            try:
                load_objects({self._name_of(engine): _TreeOnly(engine)}, info, store=store)
                break
            except CorruptCheckpointError as e:  # as a restore does: moved aside, and the next older one tried
                store.set_aside(info.path, e)
        else:
            raise RuntimeError(
                f"{consecutive} updates in a row were skipped (iterations {first}-{iteration}) and no intact "
                f"checkpoint of {store.root} was saved before iteration {first} to roll back to."
            )
        rollback = Rollback((first, iteration), info.step, (info.step + 1, engine.state.iteration), why)
        self.rollbacks.append(rollback)
        self._late.drain()  # the pending count is of the state just replaced
        log.warning("%s", rollback)

    def _started(self) -> None:
        self._late.drain()

    def _drain(self, engine: Engine) -> None:
        self._act(engine, self._late.drain())

    def attach(self, trainer: Engine) -> RemovableEventHandle:
        """Check every iteration (one late); the last count is read at EPOCH_COMPLETED and COMPLETED.

        Examples:
            >>> import tempfile, jax.numpy as jnp, optax
            >>> from ember.handlers import Checkpoint, RollbackOnDivergence
            >>> from ember.training import TrainState, create_trainer
            >>> state = TrainState.create(lambda p, x: x @ p, jnp.zeros((2, 1)), optax.sgd(0.1))
            >>> trainer = create_trainer(state, lambda m, x: jnp.mean(m(x) ** 2), skip_nonfinite=True)
            >>> handle = RollbackOnDivergence(Checkpoint({"trainer": trainer}, tempfile.mkdtemp())).attach(trainer)
        """
        self._name_of(trainer)
        with collect_handles() as made:
            trainer.add_event_handler(Events.STARTED, self._started)
            trainer.add_event_handler(Events.EPOCH_COMPLETED | Events.COMPLETED, self._drain)
            trainer.add_event_handler(Events.ITERATION_COMPLETED, self)
        return made.handle
