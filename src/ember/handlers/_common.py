"""`setup_common_training_handlers`: the usual set in one call."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from ember.checkpoint import CheckpointStore
from ember.engine import Engine, Events
from ember.handlers._checkpoint import Checkpoint
from ember.handlers._logging import ScalarLogger
from ember.handlers._lr_monitor import LRMonitor
from ember.handlers._progress import ProgressBar
from ember.handlers._renamed import renamed
from ember.handlers._savers import DiskSaver
from ember.handlers._terminate_on_nan import TerminateOnNan
from ember.writers import Writer


def setup_common_training_handlers(
    trainer: Engine,
    *,
    to_save: Mapping[str, Any] | None = None,
    save_every_iters: int = 1000,
    output_path: str | os.PathLike[str] | None = None,
    save_handler: CheckpointStore | DiskSaver | str | os.PathLike[str] | None = None,
    n_saved: int | None = 2,
    with_pbars: bool = True,
    log_every_iters: int = 100,
    stop_on_nan: bool = True,
    output_key: str = "loss",
    writer: Writer | None = None,
    running_average: float | None = 0.98,
    lr_schedule: Callable[[Any], Any] | None = None,
    log_lr: bool = False,
    checkpoint_dir: str | os.PathLike[str] | CheckpointStore | None = None,
    checkpoint_every: int | None = None,
    keep_latest: int | None = None,
    log_every: int | None = None,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Attach NaN stop, a running-average loss, progress bars, checkpoints and logging in one call.

    - ``stop_on_nan``: [`TerminateOnNan`][ember.handlers.TerminateOnNan] on ``output[output_key]``;
    - ``running_average``: a [`RunningAverage`][ember.metrics.RunningAverage] of ``output[output_key]`` with this
      ``alpha``, published as ``state.metrics[output_key]`` every iteration (on device);
    - ``progress``: a [`ProgressBar`][ember.handlers.ProgressBar] refreshed every ``log_every`` iterations showing it;
    - ``writer``: a [`ScalarLogger`][ember.handlers.ScalarLogger] writing it every ``log_every`` iterations, and with
      ``log_lr`` an [`LRMonitor`][ember.handlers.LRMonitor] (``lr_schedule``, else the step's ``"lr"`` extra);
    - ``output_path`` (or ``save_handler``): a [`Checkpoint`][ember.handlers.Checkpoint] of ``to_save`` (default: the
      trainer) every ``save_every_iters`` iterations and at COMPLETED, keeping the ``n_saved`` newest.

    The arguments are Ignite's (``to_save``, ``save_every_iters``, ``output_path``, ``save_handler``,
    ``n_saved``, ``with_pbars``, ``log_every_iters``, ``stop_on_nan``); ember's earlier names
    (``checkpoint_dir``, ``checkpoint_every``, ``keep_latest``, ``log_every``, ``progress``) work in this
    release with a ``DeprecationWarning``.

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

    owner = "setup_common_training_handlers"
    output_path = renamed(owner, "checkpoint_dir", checkpoint_dir, "output_path", output_path)
    save_every_iters = renamed(owner, "checkpoint_every", checkpoint_every, "save_every_iters", save_every_iters)
    n_saved = renamed(owner, "keep_latest", keep_latest, "n_saved", n_saved)
    log_every_iters = renamed(owner, "log_every", log_every, "log_every_iters", log_every_iters)
    with_pbars = renamed(owner, "progress", progress, "with_pbars", with_pbars)
    if not isinstance(trainer, Engine):
        raise TypeError(f"`trainer` must be an ember Engine, got {type(trainer).__name__}.")
    for name, value in (("log_every_iters", log_every_iters), ("save_every_iters", save_every_iters)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be a positive int, got {value!r}.")
    handlers: dict[str, Any] = {}

    def pick_output(output: Any) -> Any:
        return output[output_key]

    if stop_on_nan:
        handlers["terminate_on_nan"] = TerminateOnNan(pick_output)
        handlers["terminate_on_nan"].attach(trainer)
    if running_average is not None:
        handlers["running_average"] = RunningAverage(output_transform=pick_output, alpha=running_average)
        handlers["running_average"].attach(trainer, output_key)
    shown = [output_key] if running_average is not None else None
    if with_pbars:
        handlers["progress"] = ProgressBar(refresh_every=log_every_iters)
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
        handlers["checkpoint"] = Checkpoint(saved, where, n_saved=n_saved)
        handlers["checkpoint"].attach(trainer, Events.ITERATION_COMPLETED(every=save_every_iters) | Events.COMPLETED)
    return handlers
