"""Model and gradient statistics: parameter count and bytes, and a gradient-spike monitor."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ember.engine import Engine, Events, RemovableEventHandle, collect_handles
from ember.handlers._reporting.late import OneStepLate
from ember.handlers._reporting.loggers import as_async
from ember.writers import Writer

log = logging.getLogger("ember")


def count_parameters(params: Any) -> tuple[int, int]:
    """``(count, bytes)`` of the arrays in ``params``, from shapes and dtypes only (nothing is read).

    Examples:
        >>> import numpy as np
        >>> from ember.handlers import count_parameters
        >>> count_parameters({"w": np.zeros((3, 4), np.float32), "b": np.zeros(4, np.float16)})
        (16, 56)
    """
    leaves = jax.tree.leaves(params)
    return (
        sum(int(np.prod(x.shape)) for x in leaves),
        sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in leaves),
    )


class ParamStats:
    """At STARTED, writes ``params/count`` and ``params/bytes`` of the trainer's parameters (step 0).

    Args:
        writer: where the numbers go; ``None`` to only keep them in `count` and `bytes`.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.handlers import ParamStats
        >>> from ember.training import TrainState, create_trainer
        >>> state = TrainState.create(lambda p, x: x @ p["w"], {"w": jnp.zeros((3, 2))}, optax.sgd(0.1))
        >>> trainer = create_trainer(state, lambda m, b: jnp.mean(m(b) ** 2))
        >>> stats = ParamStats(); _ = stats.attach(trainer)
        >>> _ = trainer.run([jnp.ones((4, 3))]); stats.count, stats.bytes
        (6, 24)
    """

    def __init__(self, writer: Writer | None = None) -> None:
        if writer is not None and not isinstance(writer, Writer):
            raise TypeError(f"`writer` must be an ember.writers.Writer or None, got {type(writer).__name__}.")
        self.writer = writer
        self.count: int | None = None
        self.bytes: int | None = None

    def __call__(self, engine: Engine) -> None:
        """Count the parameters of ``engine.state.train_state``."""
        train_state = getattr(engine.state, "train_state", None)
        if train_state is None:
            return  # a state built from the first batch: counted at the first iteration instead
        self.count, self.bytes = count_parameters(train_state.params)
        log.info("Parameters: %d (%.2f MB)", self.count, self.bytes / 1e6)
        if self.writer is not None:
            self.writer.write_scalars(0, {"params/count": self.count, "params/bytes": self.bytes})

    def attach(self, engine: Engine) -> RemovableEventHandle:
        """Count at STARTED (or at the first iteration when the state is built from the first batch).

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import ParamStats
            >>> handle = ParamStats().attach(Engine(lambda e, b: b))
        """
        with collect_handles() as made:
            engine.add_event_handler(Events.ITERATION_COMPLETED(once=1), self._late_state)
            engine.add_event_handler(Events.STARTED, self)
            if self.writer is not None:
                self.writer = as_async(self.writer, engine)
        return made.handle

    def _late_state(self, engine: Engine) -> None:
        if self.count is None:
            self(engine)


@jax.jit
def _spike_update(ema: jax.Array, seen: jax.Array, norm: jax.Array, alpha: float, factor: float, warmup: int):
    is_spike = (seen >= warmup) & (norm > factor * ema)
    new_ema = jnp.where(seen == 0, norm, jnp.where(is_spike, ema, alpha * ema + (1 - alpha) * norm))
    return new_ema, seen + 1, is_spike


class GradientSpikeMonitor:
    """Flags steps whose gradient norm exceeds ``factor`` times its moving average.

    The trainer computes the norm in the step (``create_trainer(..., extras=("grad_norm",))``); the moving
    average and the comparison run on device, and the flag is read one iteration late, so nothing
    stalls. A spike is not folded into the average. Each spike is appended to `spikes` as
    ``(iteration, norm)``, logged, and passed to ``on_spike(engine, iteration, norm)`` if given (which
    may, say, terminate the run or lower the learning rate).

    Args:
        factor: how many times the moving average counts as a spike.
        alpha: the moving average's weight of the past, in ``(0, 1)``.
        warmup: steps before spikes are flagged (the average settles first).
        key: the output holding the norm.
        on_spike: called for each spike.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember import Engine
        >>> from ember.handlers import GradientSpikeMonitor
        >>> norms = [1.0, 1.1, 0.9, 1.0, 9.0, 1.0, 1.05]
        >>> engine = Engine(lambda e, b: {"grad_norm": jnp.float32(b)})
        >>> monitor = GradientSpikeMonitor(factor=3.0, warmup=3)
        >>> _ = monitor.attach(engine)
        >>> _ = engine.run(norms); monitor.spikes
        [(5, 9.0)]
    """

    def __init__(
        self,
        factor: float = 5.0,
        *,
        alpha: float = 0.98,
        warmup: int = 10,
        key: str = "grad_norm",
        on_spike: Callable[[Engine, int, float], Any] | None = None,
    ) -> None:
        if isinstance(factor, bool) or not isinstance(factor, int | float) or factor <= 1:
            raise ValueError(f"`factor` must be a number above 1, got {factor!r}.")
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1:
            raise ValueError(f"`alpha` must be a number in (0, 1), got {alpha!r}.")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"`warmup` must be an int of at least 0, got {warmup!r}.")
        if on_spike is not None and not callable(on_spike):
            raise TypeError(f"`on_spike` must be callable as on_spike(engine, iteration, norm), got {on_spike!r}.")
        self.factor, self.alpha, self.warmup, self.key, self.on_spike = (
            float(factor),
            float(alpha),
            warmup,
            key,
            on_spike,
        )
        self.spikes: list[tuple[int, float]] = []
        self._ema, self._seen = jnp.float32(0.0), jnp.int32(0)
        self._late = OneStepLate()

    def __call__(self, engine: Engine) -> None:
        """Update the average with this step's norm; act on the previous step's flag."""
        output = engine.state.output
        if not isinstance(output, Mapping) or self.key not in output:
            raise KeyError(
                f"GradientSpikeMonitor reads output[{self.key!r}]: build the trainer with "
                f"create_trainer(..., extras=('grad_norm',)); the output holds "
                f"{sorted(output) if isinstance(output, Mapping) else type(output).__name__}."
            )
        norm = jnp.asarray(output[self.key], jnp.float32)
        self._ema, self._seen, flag = _spike_update(self._ema, self._seen, norm, self.alpha, self.factor, self.warmup)
        self._act(engine, self._late.push(engine.state.iteration, jnp.stack([flag.astype(jnp.float32), norm])))

    def _act(self, engine: Engine, read: tuple[int, Any] | None) -> None:
        if read is None or not read[1][0]:
            return
        iteration, norm = read[0], float(read[1][1])
        self.spikes.append((iteration, norm))
        log.warning("Gradient spike at iteration %d: norm %.4g.", iteration, norm)
        if self.on_spike is not None:
            self.on_spike(engine, iteration, norm)

    def _drain(self, engine: Engine) -> None:
        self._act(engine, self._late.drain())

    def attach(self, engine: Engine) -> RemovableEventHandle:
        """Check every iteration; read the last flag at EPOCH_COMPLETED and COMPLETED.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import GradientSpikeMonitor
            >>> handle = GradientSpikeMonitor().attach(Engine(lambda e, b: b))
        """
        with collect_handles() as made:
            engine.add_event_handler(Events.EPOCH_COMPLETED | Events.COMPLETED, self._drain)
            engine.add_event_handler(Events.ITERATION_COMPLETED, self)
        return made.handle

    def state_dict(self) -> dict[str, Any]:
        """The moving average, the steps seen and the spikes so far (reads two device scalars).

        Examples:
            >>> from ember.handlers import GradientSpikeMonitor
            >>> GradientSpikeMonitor().state_dict()
            {'ema': 0.0, 'seen': 0, 'spikes': []}
        """
        return {"ema": float(self._ema), "seen": int(self._seen), "spikes": [list(s) for s in self.spikes]}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what [`state_dict`][ember.handlers.GradientSpikeMonitor.state_dict] returned.

        Examples:
            >>> from ember.handlers import GradientSpikeMonitor
            >>> m = GradientSpikeMonitor()
            >>> m.load_state_dict({"ema": 2.0, "seen": 5, "spikes": [[3, 9.0]]}); m.spikes
            [(3, 9.0)]
        """
        self._ema, self._seen = jnp.float32(state_dict["ema"]), jnp.int32(state_dict["seen"])
        self.spikes = [(int(i), float(n)) for i, n in state_dict["spikes"]]
