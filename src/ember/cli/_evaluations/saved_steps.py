"""The steps a run saved its latest checkpoints at, kept in each checkpoint for the run's watchers."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The key of a run's `SavedSteps` in its latest checkpoints (their manifests' ``metadata.state_dicts``).
KEY = "saved_steps"


class SavedSteps:
    """The steps of the checkpoints a run saved into ``folder``, saved itself in each of its latest checkpoints.

    ``ember train`` puts one in its latest `Checkpoint`'s ``to_save`` and calls `saved` after each save. The
    checkpoint of step S then lists, in its manifest, the steps saved into ``folder`` up to S (its relaunches'
    included: the list is restored with the run). A watcher that finds S knows which of them retention deleted
    before it could list them, and reports those as missed instead of skipping them in silence. ``store`` is the
    latest checkpoints' store: a save into a ``TieredStore`` counts when it went into the durable tier (``folder``,
    which a watcher reads). ``trainer``'s iteration is the step of the checkpoint being saved. The newest `LIMIT`
    steps are kept.

    Examples:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from ember import Engine
        >>> from ember.cli._evaluations.saved_steps import SavedSteps
        >>> folder, trainer = Path(tempfile.mkdtemp()), Engine(lambda e, b: b)
        >>> steps = SavedSteps(folder, None, trainer)
        >>> steps.saved(5); steps.saved(10); steps.saved(10)
        >>> _ = trainer.run(range(12)); steps.state_dict()
        {'steps': [5, 10], 'at': 12}
        >>> (folder / "step_00000015").mkdir()  # a relaunch resumes from step 15, which is in the folder
        >>> steps.load_state_dict({"steps": [5, 10], "at": 15})
        >>> steps.steps
        [5, 10, 15]
        >>> steps.load_state_dict({"steps": [5, 10], "at": 12})  # from a fast tier's step 12, not in the folder
        >>> steps.steps
        [5, 10]
    """

    #: How many of the newest steps are kept (a watcher that far behind is told of those only).
    LIMIT = 10_000

    def __init__(self, folder: Path, store: Any, trainer: Any) -> None:
        self.folder, self.store, self.trainer = Path(folder), store, trainer
        self.steps: list[int] = []

    def saved(self, step: int) -> None:
        """A checkpoint of ``step`` was just saved; it counts if it went into ``folder`` (the durable tier)."""
        from ember.checkpoint import TieredStore

        if not isinstance(self.store, TieredStore) or self.store.last_save_durable:
            self._add(step)

    def state_dict(self) -> dict[str, Any]:
        """``{"steps": [...], "at": step}``: the steps saved into ``folder`` so far; the step being saved."""
        return {"steps": list(self.steps), "at": self.trainer.state.iteration}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the steps; ``at``, when given, is the step of the checkpoint resumed, counted if in ``folder``."""
        steps = state_dict.get("steps") if isinstance(state_dict, Mapping) else None
        if not (isinstance(steps, list) and all(isinstance(s, int) for s in steps)):
            raise ValueError(f"A run's saved steps must be {{'steps': [int, ...]}}, got {state_dict!r}.")
        self.steps = list(steps)
        at = state_dict.get("at")
        if isinstance(at, int) and (self.folder / f"step_{at:08d}").is_dir():
            self._add(at)

    def _add(self, step: int) -> None:
        if not self.steps or step > self.steps[-1]:  # a step saved again (fired twice, a resumed run) counts once
            self.steps.append(step)
            del self.steps[: -self.LIMIT]


def kept_in(key: str, *stores: Any) -> bool:
    """Whether a run's latest checkpoints keep the state under ``key``: yes, unless the newest of a store has none.

    A run begun before ember kept one (a `SavedSteps`, the run's last evaluation) goes on without it, so that its
    checkpoints resume (each checkpoint of a run holds the same objects); without `SavedSteps`, its watchers report
    the checkpoints they listed and lost, not the ones never listed.

    Examples:
        >>> import tempfile, numpy as np
        >>> from ember.checkpoint import CheckpointStore
        >>> from ember.cli._evaluations.saved_steps import kept_in
        >>> store = CheckpointStore(tempfile.mkdtemp())
        >>> kept_in("saved_steps", store)  # a new run
        True
        >>> _ = store.save({"w": np.zeros(2)}, step=1, metadata={"state_dicts": {"trainer": {}}})
        >>> kept_in("saved_steps", store)
        False
    """
    for store in stores:
        found = store.checkpoints()
        if found and key not in _states(found[-1].manifest, {key: None}):  # no state dicts at all: not a run's
            return False
    return True


def saved_before(manifest: Mapping[str, Any]) -> list[int]:
    """The steps a run had saved before the checkpoint of ``manifest`` (none if it holds no `SavedSteps`).

    Examples:
        >>> from ember.cli._evaluations.saved_steps import saved_before
        >>> saved_before({"metadata": {"state_dicts": {"saved_steps": {"steps": [5, 10]}}}}), saved_before({})
        ([5, 10], [])
    """
    steps = _states(manifest, {}).get(KEY, {}).get("steps", [])
    return [s for s in steps if isinstance(s, int)]


def _states(manifest: Mapping[str, Any], default: Mapping[str, Any]) -> Mapping[str, Any]:
    """The state dicts a checkpoint's manifest holds (``default`` if it holds none)."""
    states = manifest.get("metadata", {}).get("state_dicts", default)
    return states if isinstance(states, Mapping) else default
