"""How a `Checkpoint` ranks a save (`ranked`), names it (`Naming`: Ignite's names or ember's folders), knows its own."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import numpy as np

from ember.checkpoint import CheckpointInfo
from ember.engine import Engine
from ember.handlers._checkpointing.retention import priority_text
from ember.handlers._checkpointing.save_handlers import render_filename, setup_filename_pattern


class Ranked(NamedTuple):
    """A save's place: the step that numbers it, Ignite's global step, its priority, and its score as metrics."""

    step: int
    global_step: int | None
    priority: float
    metrics: dict[str, float]


def ranked(
    engine: Engine,
    score_function: Callable[[Engine], Any] | None,
    score_name: str | None,
    global_step_transform: Callable[[Engine, Any], int] | None,
) -> Ranked:
    """A save's ``(step, global step, priority, metrics)``, Ignite's way.

    The priority is the score (recorded under ``score_name``, ``"score"`` when it has none) or else the global step
    (the engine's iteration unless ``global_step_transform`` gives it); the step numbers the checkpoint.
    """
    global_step = (
        int(global_step_transform(engine, engine.last_event_name)) if global_step_transform is not None else None
    )
    metrics: dict[str, float] = {}
    if score_function is not None:
        priority = score_of(score_function(engine))
        metrics[score_key(score_name)] = priority
    else:
        global_step = engine.state.iteration if global_step is None else global_step
        priority = global_step
    step = engine.state.iteration if global_step is None else global_step
    return Ranked(step, global_step, priority, metrics)


def in_a_name(score_name: str | None) -> str | None:
    """``score_name`` as a file or folder name shows it: an evaluation's ``"val/accuracy"`` as ``"val_accuracy"``."""
    return None if score_name is None else score_name.replace("/", "_")


def score_key(score_name: str | None) -> str:
    """What a score is recorded under in a store's manifests and folder names: its name, or ``"score"``."""
    return "score" if score_name is None else score_name


def metric_score(metric_name: str, score_sign: float = 1.0) -> Callable[[Engine], float]:
    """A ``score_function`` reading ``engine.state.metrics[metric_name]``, times ``score_sign`` (1 or -1)."""
    if score_sign not in (1.0, -1.0):
        raise ValueError(f"`score_sign` must be 1.0 or -1.0, got {score_sign!r}.")

    def score(engine: Engine) -> float:
        return score_sign * engine.state.metrics[metric_name]

    return score


def objects_name(to_save: Mapping[str, Any]) -> str:
    """Ignite's ``{name}``: the one object's key, or ``"checkpoint"`` for several."""
    return next(iter(to_save)) if len(to_save) == 1 else "checkpoint"


@dataclass(frozen=True)
class Naming:
    """What a `Checkpoint`'s names are made of: Ignite's prefix, pattern, score name and extension.

    ``to_save`` is given to each method (a ``ModelCheckpoint`` learns it at each call).

    Examples:
        >>> from ember.handlers._checkpointing.checkpoint_names import Naming
        >>> naming = Naming("mnist", None, "acc", scored=True)
        >>> naming.store_name({"model": 1}, 400, None, 0.97312, scored=True)
        'mnist_step_00000400-acc=0.9731'
        >>> naming.ignite_name({"model": 1}, 400, 0.97312)
        'mnist_model_400_acc=0.9731.ckpt'
    """

    filename_prefix: str
    filename_pattern: str | None
    score_name: str | None
    scored: bool
    ext: str = "ckpt"

    @property
    def prefix(self) -> str:
        """The prefix with Ignite's separator (``mnist_``), or nothing."""
        return f"{self.filename_prefix}_" if self.filename_prefix else ""

    def ignite_name(self, to_save: Mapping[str, Any], global_step: int | None, priority: float) -> str:
        """Ignite's file name: ``filename_pattern``, or Ignite's default pattern for the parts there are."""
        pattern = self.filename_pattern or setup_filename_pattern(
            with_prefix=bool(self.filename_prefix),
            with_score=self.scored,
            with_score_name=self.score_name is not None and self.scored,
            with_global_step=global_step is not None,
        )
        parts = {
            "filename_prefix": self.filename_prefix,
            "ext": self.ext,
            "name": objects_name(to_save),
            "score_name": in_a_name(self.score_name),
            "score": priority_text(priority) if self.scored else None,
            "global_step": global_step,
        }
        return render_filename(pattern, parts)

    def store_name(
        self, to_save: Mapping[str, Any], step: int, global_step: int | None, priority: float, *, scored: bool
    ) -> str:
        """A checkpoint folder's name in a store: ``filename_pattern``, else ``<prefix>step_<step>[-<score>]``."""
        if self.filename_pattern is not None:
            return self.ignite_name(to_save, global_step, priority)
        score = in_a_name(score_key(self.score_name))
        return f"{self.prefix}step_{step:08d}" + (f"-{score}={priority:.4f}" if scored else "")

    def metadata(self, to_save: Mapping[str, Any], priority: float) -> dict[str, Any]:
        """What a checkpoint's manifest records of the handler that wrote it (a relaunch knows its own by it)."""
        return {
            "basename": f"{self.prefix}{objects_name(to_save)}",
            "score_name": self.score_name,
            "priority": priority,
        }

    def is_mine(self, info: CheckpointInfo, to_save: Mapping[str, Any]) -> bool:
        """Whether ``info`` was written by a handler named like this one: its basename, or (older ones) its prefix."""
        recorded = info.manifest.get("metadata", {}).get("checkpoint")
        if isinstance(recorded, Mapping) and "basename" in recorded:
            return recorded["basename"] == f"{self.prefix}{objects_name(to_save)}"
        return info.path.name.startswith(self.prefix)


def score_of(value: Any) -> float:
    """A ``score_function``'s result as a number (a Python int stays one), or a ``ValueError`` saying what it was."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float | np.number | np.ndarray | jax.Array)
        or (np.ndim(value) != 0)
    ):
        raise ValueError(
            f"`score_function` must return a number (a float, or a 0-d array), got {value!r} of type "
            f"{type(value).__name__}."
        )
    return int(value) if isinstance(value, numbers.Integral) else float(value)
