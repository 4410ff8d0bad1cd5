"""`lr_find`: the learning-rate range test (fast.ai's, Ignite's ``FastaiLRFinder``) over a trainer's own step."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from ember._extras import missing
from ember.engine import Events
from ember.training._process import TrainProcess
from ember.training._step.extras import find_learning_rate, with_learning_rate
from ember.training._training_engine import TrainingEngine


@dataclass(frozen=True)
class LRFinderResult:
    """The range test's curve (the learning rates tried, the smoothed losses) and the suggested rate.

    Examples:
        >>> from ember.training import LRFinderResult
        >>> LRFinderResult(lrs=[0.1, 1.0], losses=[1.0, 0.5], suggestion=1.0).suggestion
        1.0
    """

    lrs: list[float]
    losses: list[float]
    suggestion: float

    def plot(self, path: str | Path) -> Path:
        """The loss against the learning rate (log scale), the suggestion marked, as a PNG (extra ``plots``)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise ImportError(missing("LRFinderResult.plot", "matplotlib", "plots")) from e
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(self.lrs, self.losses)
        ax.axvline(self.suggestion, color="tab:red", linestyle="--", label=f"suggestion {self.suggestion:.2e}")
        ax.set(xscale="log", xlabel="learning rate", ylabel="loss (smoothed)")
        ax.legend()
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        return Path(path)


def lr_find(
    trainer: TrainingEngine,
    data: Iterable[Any],
    *,
    start_lr: float = 1e-7,
    end_lr: float = 10.0,
    num_iter: int = 100,
    mode: Literal["exp", "linear"] = "exp",
    smooth: float = 0.05,
    diverge: float = 5.0,
) -> LRFinderResult:
    """Try learning rates from ``start_lr`` to ``end_lr`` over ``num_iter`` steps; suggest the steepest fall.

    The steps are the trainer's own compiled step, run on a copy of its train state by an engine of their
    own: the trainer, its state, its handlers and its data position are as they were afterwards. The
    optimizer must take its learning rate as a hyperparameter (``optax.inject_hyperparams(optax.adam)(
    learning_rate=...)``), which each step sets. The loss is smoothed (``smooth * loss + (1 - smooth) *
    previous``, fast.ai's and Ignite's) and the test stops when it exceeds ``diverge`` times the best. The
    suggestion is the rate where the smoothed loss falls fastest (Ignite's ``lr_suggestion``).

    Args:
        trainer: a trainer from [`create_trainer`][ember.training.create_trainer] (one step per call).
        data: batches, iterated (again, as needed) for ``num_iter`` steps.
        start_lr: the first rate.
        end_lr: the last rate.
        num_iter: steps at most.
        mode: ``"exp"`` (rates evenly spaced on a log scale) or ``"linear"``.
        smooth: the weight of the newest loss in the running smoothing.
        diverge: stop when the smoothed loss exceeds this many times the best one.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import TrainState, create_trainer, lr_find
        >>> tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
        >>> state = TrainState.create(lambda p, x: x @ p, jnp.zeros(2), tx)
        >>> trainer = create_trainer(state, lambda model, x: jnp.mean((model(x) - 1.0) ** 2))
        >>> result = lr_find(trainer, [jnp.eye(2)], start_lr=1e-3, end_lr=10.0, num_iter=30)
        >>> 1e-3 <= result.suggestion <= 10.0, float(trainer.state.train_state.params.sum())
        (True, 0.0)
    """
    process = trainer.process_function
    if not isinstance(process, TrainProcess) or process.steps_per_call != 1:
        raise ValueError("lr_find takes a trainer from create_trainer with steps_per_call=1.")
    if not 0 < start_lr < end_lr:
        raise ValueError(f"`start_lr` and `end_lr` must satisfy 0 < start_lr < end_lr, got {start_lr!r}, {end_lr!r}.")
    if isinstance(num_iter, bool) or not isinstance(num_iter, int) or num_iter < 2:
        raise ValueError(f"`num_iter` must be an int >= 2, got {num_iter!r}.")
    if mode not in ("exp", "linear"):
        raise ValueError(f"`mode` must be 'exp' or 'linear', got {mode!r}.")
    if not 0 < smooth <= 1 or not diverge > 1:
        raise ValueError(f"`smooth` must be in (0, 1] and `diverge` > 1, got {smooth!r} and {diverge!r}.")
    if trainer.state.train_state is None:
        trainer.build_state(next(iter(data)))
    state = jax.tree.map(lambda x: jnp.array(x, copy=True), trainer.state.train_state)  # the step donates its input
    if find_learning_rate(state.opt_state) is None:
        raise ValueError(
            "lr_find sets the learning rate at each step: build the optimizer with optax.inject_hyperparams, "
            "e.g. optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)."
        )
    if mode == "exp":
        rates = [start_lr * (end_lr / start_lr) ** (i / (num_iter - 1)) for i in range(num_iter)]
    else:
        rates = [start_lr + (end_lr - start_lr) * i / (num_iter - 1) for i in range(num_iter)]
    probe = TrainProcess(process.step, trainer.placement, 1, False)
    finder = TrainingEngine(probe, trainer.placement, None, 1, fusion=probe.fusion)
    finder.state.train_state = state
    lrs: list[float] = []
    losses: list[float] = []

    def set_rate(engine: TrainingEngine) -> None:
        st = engine.state.train_state
        rate = rates[engine.state.iteration - 1]
        engine.state.train_state = st.replace(opt_state=with_learning_rate(st.opt_state, rate))

    def record(engine: TrainingEngine) -> None:
        loss = float(engine.state.output["loss"])
        smoothed = loss if not losses else smooth * loss + (1 - smooth) * losses[-1]
        lrs.append(rates[engine.state.iteration - 1])
        losses.append(smoothed)
        if not math.isfinite(smoothed) or smoothed > diverge * min(losses):
            engine.terminate()

    finder.add_event_handler(Events.ITERATION_STARTED, set_rate)
    finder.add_event_handler(Events.ITERATION_COMPLETED, record)
    finder.run(data, max_iters=num_iter)
    falls = np.diff(np.asarray(losses)) if len(losses) > 1 else np.zeros(1)
    suggestion = lrs[int(np.argmin(falls)) + 1] if len(losses) > 1 else lrs[0]
    return LRFinderResult(lrs=lrs, losses=losses, suggestion=suggestion)
