"""`CheckpointRecord`: what a `Checkpoint` keeps, by Ignite's names, and the path to a save handler of your own."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax

from ember.checkpoint._stores import Store
from ember.engine import Engine
from ember.handlers._retention import Ledger, priority_text
from ember.handlers._save_handlers import SaveHandler, checkpoint_dict, render_filename, setup_filename_pattern


class CheckpointRecord:
    """What a [`Checkpoint`][ember.handlers.Checkpoint] keeps and how it names it: it inherits this.

    Ignite's ``last_checkpoint``, ``state_dict``, ``reset``, the file names, and the save to your own save handler.
    """

    store: Store | None
    save_handler: Any
    to_save: Mapping[str, Any]
    score_name: str | None
    score_function: Any
    filename_prefix: str
    filename_pattern: str | None
    ext: str
    include_self: bool
    save_on_rank: int
    _with_metadata: bool
    _prefix: str
    _ledger: Ledger
    _seeded: bool
    _before: Any
    _seed: Callable[[], None]  # the store's checkpoints of this handler join what it keeps (CheckpointFiles')

    def _failures(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    @property
    def last_checkpoint(self) -> Path | str | None:
        """The checkpoint Ignite's ``last_checkpoint`` names: the best kept (by score, else the newest), or ``None``.

        A ``pathlib.Path`` (the checkpoint's folder) with a store, the file name with your own save handler. It is
        set as soon as the save is scheduled, so a background write may still be in flight: ``saver.wait()``
        returns once it is on disk. A relaunched handler knows the checkpoints of its own already in the store.
        """
        self._seed()
        best = self._ledger.best()
        if best is None:
            return None
        return self.store.path_of(best.filename) if self.store is not None else best.filename

    @staticmethod
    def setup_filename_pattern(
        with_prefix: bool = True, with_score: bool = True, with_score_name: bool = True, with_global_step: bool = True
    ) -> str:
        """Ignite's default file name pattern, with the parts asked for.

        Examples:
            >>> from ember.handlers import Checkpoint
            >>> Checkpoint.setup_filename_pattern(with_score=False, with_score_name=False)
            '{filename_prefix}_{name}_{global_step}.{ext}'
        """
        return setup_filename_pattern(with_prefix, with_score, with_score_name, with_global_step)

    @staticmethod
    def get_default_score_fn(metric_name: str, score_sign: float = 1.0) -> Callable[[Engine], float]:
        """A ``score_function`` reading ``engine.state.metrics[metric_name]``, times ``score_sign`` (1 or -1).

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import Checkpoint
            >>> engine = Engine(lambda e, b: b)
            >>> engine.state.metrics["loss"] = 0.25
            >>> Checkpoint.get_default_score_fn("loss", -1.0)(engine)
            -0.25
        """
        if score_sign not in (1.0, -1.0):
            raise ValueError(f"`score_sign` must be 1.0 or -1.0, got {score_sign!r}.")

        def score(engine: Engine) -> float:
            return score_sign * engine.state.metrics[metric_name]

        return score

    def reset(self) -> None:
        """Forget the checkpoints kept so far (Ignite's ``reset``): later saves never remove them.

        Call it at STARTED when one handler serves several independent runs (folds).

        Examples:
            >>> import tempfile
            >>> from ember import Engine
            >>> from ember.handlers import Checkpoint
            >>> trainer = Engine(lambda e, b: b)
            >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp())
            >>> _ = trainer.run([1, 2]); _ = saver.save_now(trainer)
            >>> saver.reset(); print(saver.last_checkpoint)
            None
        """
        self._ledger.restore(([], 0))
        self._seeded, self._before = True, None

    def state_dict(self) -> dict[str, Any]:
        """What this handler keeps, as Ignite's ``{"_saved": [(priority, filename), ...]}`` (and the steps).

        Examples:
            >>> import tempfile
            >>> from ember import Engine
            >>> from ember.handlers import Checkpoint
            >>> trainer = Engine(lambda e, b: b)
            >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp())
            >>> _ = trainer.run([1, 2]); _ = saver.save_now(trainer)
            >>> saver.state_dict()
            {'_saved': [(2, 'step_00000002')], 'steps': [2]}
        """
        self._seed()
        return self._ledger.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Take over what a saved handler kept; its checkpoints are removed as later saves push them out.

        Examples:
            >>> import tempfile
            >>> from ember import Engine
            >>> from ember.handlers import Checkpoint
            >>> saver = Checkpoint({"trainer": Engine(lambda e, b: b)}, tempfile.mkdtemp())
            >>> saver.load_state_dict({"_saved": [(4, "step_00000004")]}); saver.last_checkpoint.name
            'step_00000004'
        """
        self._ledger.load_state_dict(state_dict)
        self._seeded, self._before = True, None

    def _name(self, global_step: int | None, priority: float, *, default: str | None = None) -> str:
        if self.filename_pattern is None and default is not None:
            return default
        scored = self.score_function is not None
        pattern = self.filename_pattern or setup_filename_pattern(
            with_prefix=bool(self.filename_prefix),
            with_score=scored,
            with_score_name=self.score_name is not None and scored,
            with_global_step=global_step is not None,
        )
        parts = {
            "filename_prefix": self.filename_prefix,
            "ext": self.ext,
            "name": next(iter(self.to_save)) if len(self.to_save) == 1 else "checkpoint",
            "score_name": self.score_name,
            "score": priority_text(priority) if scored else None,
            "global_step": global_step,
        }
        return render_filename(pattern, parts)

    def _metadata(self, priority: float) -> dict[str, Any]:
        name = next(iter(self.to_save)) if len(self.to_save) == 1 else "checkpoint"
        return {"basename": f"{self._prefix}{name}", "score_name": self.score_name, "priority": priority}

    def _call_handler(
        self, step: int, global_step: int | None, priority: float, states: dict[str, Any], trees: dict[str, Any]
    ) -> bool:
        """Ignite's path: the checkpoint dict to your save handler, then ``remove`` for what is no longer kept.

        Returns whether a checkpoint was saved (retention may not admit it).
        """
        if not self._ledger.admits(step, priority):
            return False
        filename = self._name(global_step, priority)
        checkpoint: dict[str, Any] = checkpoint_dict(states, trees)
        if len(checkpoint) == 1:
            checkpoint = next(iter(checkpoint.values()))  # Ignite saves a single object's state as it is
        before = self._ledger.snapshot()
        removed = self._ledger.add(filename, step, priority)
        if self.include_self:
            checkpoint["checkpointer"] = self.state_dict()
        mine = jax.process_index() == self.save_on_rank
        try:
            with self._failures():
                if mine and self._with_metadata:
                    self.save_handler(checkpoint, filename, self._metadata(priority))
                elif mine:
                    self.save_handler(checkpoint, filename)
        except BaseException:
            self._ledger.restore(before)
            raise
        if mine and isinstance(self.save_handler, SaveHandler):
            for entry in removed:
                self.save_handler.remove(entry.filename)
        return True
