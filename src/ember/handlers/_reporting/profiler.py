"""`Profiler`: a `jax.profiler` trace of N steps, readable in TensorBoard's profile tab."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax

from ember.engine import Engine, Events, RemovableEventHandle, collect_handles


class Profiler:
    """Traces iterations ``start_step`` to ``start_step + num_steps - 1`` with ``jax.profiler``.

    The trace starts at ITERATION_STARTED of ``start_step`` (after compilation and warm-up, if you pick a
    step past the first few) and stops once the last traced step's output is computed, so the trace holds
    the device work of exactly those steps. It lands in ``logdir/plugins/profile/<run>/`` where
    TensorBoard's profile plugin (``tensorboard-plugin-profile``) or Perfetto reads it. A run that ends or
    fails inside the window stops the trace too.

    Args:
        logdir: the trace folder (TensorBoard's log dir).
        start_step: first traced iteration (1-based).
        num_steps: how many iterations to trace.

    Examples:
        >>> import tempfile
        >>> from pathlib import Path
        >>> import jax.numpy as jnp
        >>> from ember import Engine
        >>> from ember.handlers import Profiler
        >>> logdir = tempfile.mkdtemp()
        >>> engine = Engine(lambda e, b: jnp.sin(jnp.float32(b)))
        >>> profiler = Profiler(logdir, start_step=2, num_steps=2); _ = profiler.attach(engine)
        >>> _ = engine.run(range(5))
        >>> profiler.traced, len(list(Path(logdir).rglob("*.xplane.pb")))
        ([2, 3], 1)
    """

    def __init__(self, logdir: str | os.PathLike[str], *, start_step: int = 10, num_steps: int = 5) -> None:
        for name, value in (("start_step", start_step), ("num_steps", num_steps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive int, got {value!r}.")
        self.logdir = Path(logdir)
        self.start_step, self.num_steps = start_step, num_steps
        self.active = False
        self.traced: list[int] = []

    def _start(self, engine: Engine) -> None:
        if engine.state.iteration == self.start_step and not self.active:
            self.logdir.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.logdir))
            self.active = True

    def _step(self, engine: Engine) -> None:
        if not self.active:
            return
        self.traced.append(engine.state.iteration)
        if engine.state.iteration >= self.start_step + self.num_steps - 1:
            self._stop(engine)

    def _stop(self, engine: Engine, *_: Any) -> None:
        if self.active:
            jax.block_until_ready(engine.state.output)
            jax.profiler.stop_trace()
            self.active = False

    def attach(self, engine: Engine) -> RemovableEventHandle:
        """Start at ``start_step``'s ITERATION_STARTED; stop after the window, at COMPLETED or on an error.

        Returns the handle of the registration that starts the trace: removed, no trace starts.

        Examples:
            >>> import tempfile
            >>> from ember import Engine
            >>> from ember.handlers import Profiler
            >>> Profiler(tempfile.mkdtemp()).attach(Engine(lambda e, b: b)).remove()
        """
        with collect_handles() as made:
            engine.add_event_handler(Events.ITERATION_STARTED(once=self.start_step), self._start)
            engine.add_event_handler(Events.ITERATION_COMPLETED, self._step)
            engine.add_event_handler(Events.COMPLETED | Events.EXCEPTION_RAISED, self._stop)
        return made.handle
