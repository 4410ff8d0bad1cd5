"""The `evaluations:` section of an `ember train` run: each evaluation's evaluator, data, noise and schedule."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import optax

from ember import Events
from ember.cli._schema import Config, EvaluationConfig
from ember.data import ArrayDataset, Masked
from ember.errors import ConfigError
from ember.metrics import Accuracy, Loss
from ember.training import create_evaluator

#: ``name -> (evaluator, data, schedule)``
Extra = dict[str, tuple[Any, Any, Any]]


def build_evaluations(cfg: Config, trainer: Any, val: Any, predict: Any) -> Extra:
    """Each evaluation of ``cfg.evaluations``: an evaluator of accuracy and loss, its data and its schedule."""
    extra: Extra = {}
    for name, evaluation in cfg.evaluations.items():
        evaluator = classifier_evaluator(cfg, trainer, predict)
        extra[name] = (evaluator, evaluation_data(cfg, name, evaluation, val), schedule_of(evaluation))
    return extra


def classifier_evaluator(cfg: Config, trainer: Any, predict: Any) -> Any:
    """An evaluator of ``trainer``'s model with the run's placement and precision: its accuracy and loss.

    With ``optimizer.ema``, it evaluates the parameters' moving average.
    """
    evaluator = create_evaluator(
        trainer,
        predict,
        placement=trainer.placement,
        precision=cfg.trainer.precision,
        use_ema=cfg.optimizer.ema is not None,
    )
    Accuracy().attach(evaluator, "accuracy")
    Loss(optax.softmax_cross_entropy_with_integer_labels).attach(evaluator, "loss")
    return evaluator


def schedule_of(evaluation: EvaluationConfig) -> Any:
    """The trainer's events an evaluation runs at: by ``every_epochs``, ``every_iters``, ``every_secs``, ``at_iters``.

    Examples:
        >>> from ember.cli._schema import EvaluationConfig
        >>> from ember.cli._evaluations.sections import schedule_of
        >>> schedule_of(EvaluationConfig(every_epochs=None, every_iters=100))
        Events.ITERATION_COMPLETED(every=100)
    """
    events = []
    if evaluation.every_epochs is not None:
        events.append(Events.EPOCH_COMPLETED(every=evaluation.every_epochs))
    if evaluation.every_iters is not None:
        events.append(Events.ITERATION_COMPLETED(every=evaluation.every_iters))
    if evaluation.every_secs is not None:
        events.append(Events.ITERATION_COMPLETED(every_secs=evaluation.every_secs))
    if evaluation.at_iters:
        events.append(Events.ITERATION_COMPLETED(once=sorted(set(evaluation.at_iters))))
    schedule = events[0]
    for event in events[1:]:
        schedule = schedule | event
    return schedule


def evaluation_data(cfg: Config, name: str, evaluation: EvaluationConfig, val: Any) -> Any:
    """An evaluation's batches: the run's validation data, or a folder's ``x.npy`` and ``y.npy``; with its noise."""
    if evaluation.data == "val":
        data = val
    else:
        folder = Path(evaluation.data)
        missing = [f for f in ("x.npy", "y.npy") if not (folder / f).is_file()]
        if missing:
            raise ConfigError(
                f"evaluations.{name}.data: expected 'val' or a folder holding x.npy and y.npy; {folder} lacks "
                f"{', '.join(missing)}."
            )
        arrays = {"x": np.load(folder / "x.npy", mmap_mode="r"), "y": np.load(folder / "y.npy", mmap_mode="r")}
        if len(arrays["x"]) != len(arrays["y"]):
            raise ConfigError(
                f"evaluations.{name}.data: x.npy holds {len(arrays['x'])} examples and y.npy {len(arrays['y'])}."
            )
        data = ArrayDataset(arrays, batch_size=cfg.data.batch_size)
    if evaluation.noise <= 0:
        return data
    if isinstance(data, ArrayDataset):  # the noise drawn once over every example: the same on any number of processes
        x = np.asarray(data.arrays["x"])
        noisy = (x + np.random.default_rng(cfg.data.seed).normal(0.0, evaluation.noise, x.shape)).astype(x.dtype)
        return ArrayDataset({**data.arrays, "x": noisy}, batch_size=data.batch_size)
    return Noisy(data, evaluation.noise, seed=cfg.data.seed)


class Noisy:
    """``data``'s batches with Gaussian noise of deviation ``sigma`` added to ``x``: the same at every pass.

    For data that is not an ``ArrayDataset`` (whose noise is drawn over every example at once): the noise follows the
    batches this process reads, so it depends on the number of processes.

    Examples:
        >>> import numpy as np
        >>> from ember.cli._evaluations.sections import Noisy
        >>> noisy = Noisy([{"x": np.zeros((2, 1), np.float32), "y": np.zeros(2)}], 1.0, seed=0)
        >>> first, again = next(iter(noisy))["x"], next(iter(noisy))["x"]
        >>> first.dtype, bool((first == again).all()), bool((first != 0).all())
        (dtype('float32'), True, True)
    """

    def __init__(self, data: Any, sigma: float, *, seed: int) -> None:
        self.data, self.sigma, self.seed = data, sigma, seed

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[Any]:
        rng = np.random.default_rng(self.seed)  # each pass draws the same noise, batch by batch
        for batch in self.data:
            inner = batch.batch if isinstance(batch, Masked) else batch  # a process's padded part of a batch
            x = np.asarray(inner["x"])
            noisy = {**inner, "x": (x + rng.normal(0.0, self.sigma, x.shape)).astype(x.dtype)}
            yield Masked(noisy, batch.mask) if isinstance(batch, Masked) else noisy
