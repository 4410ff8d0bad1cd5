"""Evaluation as its own job: ``ember eval``, a run's model and evaluators built from its ``config.yaml``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from ember.cli._classifier import build_trainer, learning_rates, predict
from ember.cli._evaluations.sections import build_evaluations, classifier_evaluator


def evaluate_run(
    run_dir: str | Path, checkpoint: str = "latest", overrides: Sequence[str] = (), *, stream: TextIO | None = None
) -> dict[str, Any]:
    """``ember eval``: every evaluation of a run (``val`` and its ``evaluations:``) on one of its checkpoints.

    The run's ``config.yaml`` builds the model, the data and the evaluators (``overrides`` change it: another
    placement or device count, a larger batch); ``checkpoint`` is ``latest`` (the newest checkpoint in the run
    folder), ``best`` (the best by the accuracy ``best_on`` names) or a step. The metrics are printed, one line an
    evaluation, and appended to ``RUN_DIR/eval.jsonl`` at the checkpoint's step, as ``name/metric``.

    Returns:
        ``{"step", "checkpoint", "metrics"}``.
    """
    from ember.writers import JsonlWriter

    job = EvaluationJob(run_dir, overrides)
    info = checkpoint_of(job.run, checkpoint)
    metrics = job.evaluate(info, stream)
    import jax

    if jax.process_index() == 0:  # every process evaluates; one writes
        record = JsonlWriter(job.run / "eval.jsonl")
        record.write_scalars(info.step, metrics)
        record.close()
    return {"step": info.step, "checkpoint": info.path.name, "metrics": metrics}


class EvaluationJob:
    """A run's model and evaluators, built from its ``config.yaml`` in a job of their own (``ember eval``)."""

    def __init__(self, run_dir: str | Path, overrides: Sequence[str] = ()) -> None:
        from ember.cli._config import config_source, importable, load_config
        from ember.cli._registry import build_data

        self.run = Path(run_dir)
        saved = self.run / "config.yaml"
        if not saved.is_file():
            raise FileNotFoundError(f"{self.run} has no config.yaml; is it a run folder of ember train?")
        self.cfg = cfg = load_config(saved, overrides)
        importable(config_source(saved))
        importable(Path.cwd())
        data, val, sample = build_data(cfg.data)
        self.trainer = build_trainer(cfg, sample, learning_rates(cfg, data)[1])  # the run's optimizer state
        self.runs = {"val": (classifier_evaluator(cfg, self.trainer, predict), val)}
        self.runs |= {n: (e, d) for n, (e, d, _) in build_evaluations(cfg, self.trainer, val, predict).items()}

    def evaluate(self, info: Any, stream: TextIO | None = None) -> dict[str, float]:
        """Restore the checkpoint ``info`` and run every evaluation on it; print a line each; return the metrics."""
        self.restore(info)
        return self.run_all(info, stream)

    def restore(self, info: Any) -> None:
        """Restore the checkpoint ``info`` into the trainer (its train state, onto this job's own placement)."""
        from ember.handlers import load_objects

        load_objects({"trainer": self.trainer}, info.path)

    def run_all(self, info: Any, stream: TextIO | None = None) -> dict[str, float]:
        """Every evaluation on the state restored from ``info``; a line each printed (by process 0); the metrics."""
        import jax

        metrics: dict[str, float] = {}
        for name, (engine, data) in self.runs.items():
            engine.run(data)
            found = {f"{name}/{k}": float(v) for k, v in engine.state.metrics.items()}
            metrics |= found
            shown = "  ".join(f"{k} {v:.4f}" for k, v in found.items())
            if jax.process_index() == 0:
                print(f"{info.path.name} (iteration {info.step}): {shown}", file=stream, flush=True)
        return metrics


def checkpoint_of(run: Path, which: str) -> Any:
    """The checkpoint ``which`` (``latest``, ``best``, or a step) names in the run folder ``run`` (`chosen`'s)."""
    from ember.checkpoint._init_from import chosen

    if which not in ("latest", "best") and not which.isdigit():
        raise ValueError(f"`--checkpoint` must be latest, best or a step (an int), got {which!r}.")
    return chosen(run, which)[1]
