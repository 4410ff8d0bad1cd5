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
from ember.handlers._terminate_on_nan import TerminateOnNan
from ember.writers import Writer


def setup_common_training_handlers(
    trainer: Engine,
    *,
    output_key: str = "loss",
    writer: Writer | None = None,
    log_every: int = 100,
    progress: bool = True,
    stop_on_nan: bool = True,
    running_average: float | None = 0.98,
    checkpoint_dir: str | os.PathLike[str] | CheckpointStore | None = None,
    checkpoint_every: int = 1000,
    to_save: Mapping[str, Any] | None = None,
    keep_latest: int = 2,
    lr_schedule: Callable[[Any], Any] | None = None,
    log_lr: bool = False,
) -> dict[str, Any]:
    """Attach NaN stop, a running-average loss, progress bars, checkpoints and logging in one call.

    - ``stop_on_nan``: :class:`TerminateOnNan` on ``output[output_key]``;
    - ``running_average``: a :class:`~ember.metrics.RunningAverage` of ``output[output_key]`` with this
      ``alpha``, published as ``state.metrics[output_key]`` every iteration (on device);
    - ``progress``: a :class:`ProgressBar` refreshed every ``log_every`` iterations showing it;
    - ``writer``: a :class:`ScalarLogger` writing it every ``log_every`` iterations, and with ``log_lr`` an
      :class:`LRMonitor` (``lr_schedule``, else the step's ``"lr"`` extra);
    - ``checkpoint_dir``: a :class:`Checkpoint` of ``to_save`` (default: the trainer) every
      ``checkpoint_every`` iterations and at COMPLETED, keeping the ``keep_latest`` newest.

    Returns:
        The attached handlers by name (``"terminate_on_nan"``, ``"running_average"``, ``"progress"``,
        ``"logger"``, ``"lr_monitor"``, ``"checkpoint"``), for those turned on.

    Examples:
        >>> import io, tempfile
        >>> from ember import Engine
        >>> from ember.handlers import setup_common_training_handlers
        >>> trainer = Engine(lambda e, b: {"loss": b})
        >>> handlers = setup_common_training_handlers(trainer, checkpoint_dir=tempfile.mkdtemp(), progress=False)
        >>> sorted(handlers)
        ['checkpoint', 'running_average', 'terminate_on_nan']
        >>> round(float(trainer.run([1.0, 0.0]).metrics["loss"]), 4)
        0.98
    """
    from ember.metrics import RunningAverage  # the metrics layer pulls in jax; imported when used

    if not isinstance(trainer, Engine):
        raise TypeError(f"`trainer` must be an ember Engine, got {type(trainer).__name__}.")
    for name, value in (("log_every", log_every), ("checkpoint_every", checkpoint_every)):
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
    if progress:
        handlers["progress"] = ProgressBar(refresh_every=log_every)
        handlers["progress"].attach(trainer, metric_names=shown, output_keys=None if shown else [output_key])
    if writer is not None:
        handlers["logger"] = ScalarLogger(
            writer, tag="train", metric_names=shown, output_keys=None if shown else [output_key]
        )
        handlers["logger"].attach(trainer, Events.ITERATION_COMPLETED(every=log_every))
        if log_lr:
            handlers["lr_monitor"] = LRMonitor(handlers["logger"].writer, schedule=lr_schedule)
            handlers["lr_monitor"].attach(trainer, Events.ITERATION_COMPLETED(every=log_every))
    if checkpoint_dir is not None:
        saved = dict(to_save) if to_save is not None else {"trainer": trainer}
        handlers["checkpoint"] = Checkpoint(saved, checkpoint_dir, keep_latest=keep_latest)
        handlers["checkpoint"].attach(trainer, Events.ITERATION_COMPLETED(every=checkpoint_every) | Events.COMPLETED)
    return handlers
