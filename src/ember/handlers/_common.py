"""`setup_common_training_handlers`: the usual set in one call."""

from __future__ import annotations

import functools
import numbers
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ember.checkpoint._store import Store
from ember.engine import Engine, Events
from ember.handlers._checkpointing.checkpoint import Checkpoint
from ember.handlers._checkpointing.savers import DiskSaver
from ember.handlers._reporting.loggers import ScalarLogger
from ember.handlers._reporting.lr_monitor import LRMonitor
from ember.handlers._reporting.progress import ProgressBar
from ember.handlers._resilience.terminate_on_nan import TerminateOnNan
from ember.writers import Writer


def setup_common_training_handlers(
    trainer: Engine,
    *,
    train_sampler: Any = None,
    to_save: Mapping[str, Any] | None = None,
    save_every_iters: int = 1000,
    output_path: str | os.PathLike[str] | None = None,
    save_handler: Store | DiskSaver | Callable[..., Any] | str | os.PathLike[str] | None = None,
    n_saved: int | None = 2,
    output_names: Iterable[str] | None = None,
    with_pbars: bool = True,
    with_pbar_on_iters: bool = True,
    log_every_iters: int = 100,
    stop_on_nan: bool = True,
    output_key: str = "loss",
    writer: Writer | None = None,
    running_average: float | None = 0.98,
    lr_schedule: Callable[[Any], Any] | None = None,
    log_lr: bool = False,
    **kwargs: Any,
) -> dict[str, Any]:
    """Attach NaN stop, a running-average loss, progress bars, checkpoints and logging in one call.

    - ``stop_on_nan``: [`TerminateOnNan`][ember.handlers.TerminateOnNan] on ``output[output_key]``;
    - ``running_average``: a [`RunningAverage`][ember.metrics.RunningAverage] of ``output[output_key]`` with this
      ``alpha``, published as ``state.metrics[output_key]`` every iteration (on device); with ``output_names``
      (Ignite's), one per name instead: ``output[name]`` of a mapping, ``output[i]`` of a sequence, or the output
      itself when it is one array or number;
    - ``with_pbars``: a [`ProgressBar`][ember.handlers.ProgressBar] over the epochs and, with ``with_pbar_on_iters``,
      over each epoch's iterations, refreshed every ``log_every_iters`` iterations, showing those averages;
    - ``train_sampler``: its ``set_epoch(epoch - 1)`` at each EPOCH_STARTED (Ignite's, for a torch
      ``DistributedSampler``; ember's own data takes its epoch from the engine already);
    - ``writer``: a [`ScalarLogger`][ember.handlers.ScalarLogger] writing it every ``log_every_iters`` iterations, and
      with
      ``log_lr`` an [`LRMonitor`][ember.handlers.LRMonitor] (``lr_schedule``, else the step's ``"lr"`` extra);
    - ``output_path`` (or ``save_handler``, a store or your own save handler): a
      [`Checkpoint`][ember.handlers.Checkpoint] of ``to_save`` (default: the trainer) every ``save_every_iters``
      iterations and at COMPLETED, keeping the ``n_saved`` newest; ``to_save`` without either is an error (Ignite's).

    The arguments are Ignite's (``train_sampler``, ``to_save``, ``save_every_iters``, ``output_path``,
    ``save_handler``, ``n_saved``, ``output_names``, ``with_pbars``, ``with_pbar_on_iters``, ``log_every_iters``,
    ``stop_on_nan``).

    Other keyword arguments go to the [`Checkpoint`][ember.handlers.Checkpoint] (Ignite's ``**kwargs``:
    ``filename_prefix``, ``score_function``, ...).

    Returns:
        The attached handlers by name (``"terminate_on_nan"``, ``"running_average"``, ``"progress"``,
        ``"logger"``, ``"lr_monitor"``, ``"checkpoint"``), for those turned on.

    Examples:
        >>> import io, tempfile
        >>> from ember import Engine
        >>> from ember.handlers import setup_common_training_handlers
        >>> trainer = Engine(lambda e, b: {"loss": b})
        >>> handlers = setup_common_training_handlers(trainer, output_path=tempfile.mkdtemp(), with_pbars=False)
        >>> sorted(handlers)
        ['checkpoint', 'running_average', 'terminate_on_nan']
        >>> round(float(trainer.run([1.0, 0.0]).metrics["loss"]), 4)
        0.98
    """
    from ember.metrics import RunningAverage  # the metrics layer pulls in jax; imported when used

    if not isinstance(trainer, Engine):
        raise TypeError(f"`trainer` must be an ember Engine, got {type(trainer).__name__}.")
    for name, value in (("log_every_iters", log_every_iters), ("save_every_iters", save_every_iters)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be a positive int, got {value!r}.")
    if train_sampler is not None and not callable(getattr(train_sampler, "set_epoch", None)):
        raise TypeError(f"`train_sampler` must have a set_epoch(epoch) method, got {type(train_sampler).__name__}.")
    names = _output_names(output_names)
    if kwargs and output_path is None and save_handler is None:
        raise TypeError(
            f"setup_common_training_handlers got {sorted(kwargs)}, which only apply to the checkpoint; pass "
            "output_path or save_handler too, or drop them."
        )
    if to_save is not None and output_path is None and save_handler is None:
        raise ValueError("`to_save` was given, but neither `output_path` nor `save_handler`: where should it be saved?")
    handlers: dict[str, Any] = {}

    def pick_output(output: Any) -> Any:
        return output[output_key]

    if train_sampler is not None:
        trainer.add_event_handler(Events.EPOCH_STARTED, lambda engine: train_sampler.set_epoch(engine.state.epoch - 1))
    if stop_on_nan:
        handlers["terminate_on_nan"] = TerminateOnNan(pick_output if names is None else lambda output: output)
        handlers["terminate_on_nan"].attach(trainer)
    if names is not None:
        alpha = 0.98 if running_average is None else running_average
        handlers["running_average"] = [
            RunningAverage(output_transform=functools.partial(_named_output, index=i, name=n), alpha=alpha)
            for i, n in enumerate(names)
        ]
        for n, average in zip(names, handlers["running_average"], strict=True):
            average.attach(trainer, n)
    elif running_average is not None:
        handlers["running_average"] = RunningAverage(output_transform=pick_output, alpha=running_average)
        handlers["running_average"].attach(trainer, output_key)
    shown = names if names is not None else [output_key] if running_average is not None else None
    if with_pbars:
        handlers["progress"] = ProgressBar(
            refresh_every=log_every_iters, epoch_bar=True, iteration_bar=with_pbar_on_iters
        )
        handlers["progress"].attach(trainer, metric_names=shown, output_keys=None if shown else [output_key])
    if writer is not None:
        handlers["logger"] = ScalarLogger(
            writer, tag="train", metric_names=shown, output_keys=None if shown else [output_key]
        )
        handlers["logger"].attach(trainer, Events.ITERATION_COMPLETED(every=log_every_iters))
        if log_lr:
            handlers["lr_monitor"] = LRMonitor(handlers["logger"].writer, schedule=lr_schedule)
            handlers["lr_monitor"].attach(trainer, Events.ITERATION_COMPLETED(every=log_every_iters))
    if output_path is not None and save_handler is not None:
        raise ValueError("Pass `output_path` or `save_handler`, not both: both say where checkpoints go.")
    where = save_handler if save_handler is not None else output_path
    if where is not None:
        saved = dict(to_save) if to_save is not None else {"trainer": trainer}
        handlers["checkpoint"] = Checkpoint(saved, where, n_saved=n_saved, **kwargs)
        handlers["checkpoint"].attach(trainer, Events.ITERATION_COMPLETED(every=save_every_iters) | Events.COMPLETED)
    return handlers


def _output_names(output_names: Iterable[str] | None) -> list[str] | None:
    if output_names is None:
        return None
    if isinstance(output_names, str) or not all(isinstance(n, str) and n for n in output_names):
        raise TypeError(f"`output_names` must be a list of names of the trainer's outputs, got {output_names!r}.")
    return list(output_names)


def _named_output(output: Any, index: int, name: str) -> Any:
    """Ignite's pick for ``output_names``: by name from a mapping, by position from a sequence, else the output."""
    if isinstance(output, Mapping):
        return output[name]
    if isinstance(output, Sequence) and not isinstance(output, str):
        return output[index]
    if isinstance(output, numbers.Number) or hasattr(output, "shape"):
        return output
    raise TypeError(
        f"`output_names` picks from a mapping, a sequence, an array or a number; the trainer's output is a "
        f"{type(output).__name__}."
    )
