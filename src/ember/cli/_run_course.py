"""How an `ember train` run goes: its first line, what it logs beside the loss, the checks that stop it, and why."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from ember.cli._run_checkpoints import fast_tier
from ember.cli._schema import Config
from ember.handlers import EarlyStopping, Preemption
from ember.handlers._resilience.rollback import REASONS

#: Updates skipped in a row that stop a run whose data has no length (else: an epoch's worth).
SKIP_LIMIT = 100

_PRECISION_WORDS = {
    "32-true": "float32",
    "bf16-mixed": "bfloat16 with float32 parameters",
    "bf16-true": "bfloat16, parameters stored in bfloat16",
    "16-mixed": "float16 with float32 parameters and dynamic loss scaling",
}


def runs_on(trainer: Any, cfg: Config) -> str:
    """One line: the backend, the devices (and processes), the placement, the precision and the update guard."""
    devices, processes = jax.device_count(), jax.process_count()
    where = f"{devices} device{'s' if devices != 1 else ''}" + (f" in {processes} processes" if processes > 1 else "")
    placement = type(trainer.placement).__name__
    chosen = f"{placement} (auto)" if cfg.trainer.placement == "auto" else placement
    precision = _PRECISION_WORDS[cfg.trainer.precision]
    line = f"Training on {jax.default_backend()}: {where}, placement {chosen}, precision {precision}."
    if cfg.trainer.skip_nonfinite:
        rollback, spike = cfg.trainer.rollback_after, cfg.trainer.spike_factor
        spikes = f", or a spike past {spike:g} times their average," if spike is not None else ""
        back = f", rolled back after {rollback} in a row" if rollback is not None else ""
        return f"{line} Updates with a non-finite loss or gradients{spikes} are skipped{back}."
    return line


def watching(cfg: Config, run_dir: Any) -> str | None:
    """The run's second line, when it has more than the stock handlers: the stall watchdog and the checkpoint tiers.

    Examples:
        >>> from ember.cli._config import load_config
        >>> cfg = load_config(None, ["handlers.stall={step_timeout: 60}", "handlers.checkpoint.fast_dir=/dev/shm"])
        >>> for part in watching(cfg, "runs/digits").split("; "):
        ...     print(part)
        Watching: a stall watchdog (an iteration within 60 s, the first within 1800 s)
        checkpoints in /dev/shm, every 5th also in runs/digits.
    """
    said = []
    stall = cfg.handlers.stall
    if stall is not None:
        saves = f", a checkpoint write within {stall.save_timeout:g} s" if stall.save_timeout is not None else ""
        said.append(
            f"a stall watchdog (an iteration within {stall.step_timeout:g} s, the first within "
            f"{stall.startup_timeout:g} s{saves})"
        )
    fast = fast_tier(cfg.handlers.checkpoint, Path(run_dir))
    if fast is not None:
        every = cfg.handlers.checkpoint.durable_every
        said.append(f"checkpoints in {fast}, every {_nth(every)} also in {run_dir}")
    return f"Watching: {'; '.join(said)}." if said else None


def _nth(n: int) -> str:
    return {1: "one", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def logged_outputs(scaled: bool, guarded: bool) -> Any:
    """What of the step's output ``train/`` logs beside the loss: the loss scale, the steps skipped."""
    if not guarded:
        return None

    def logged(out: Any) -> dict[str, Any]:
        return {"skipped_steps": out["skipped"], **({"loss_scale": out["loss_scale"]} if scaled else {})}

    return logged


def nan_check(guarded: bool, skip_limit: int) -> Any:
    """What `TerminateOnNan` checks inside the compiled step: the loss, or with the update guard, the skips.

    A skipped step's loss is the guard's to handle (not a NaN), but ``skip_limit`` skips in a row stop the run too
    (read as a NaN).
    """
    if not guarded:
        return lambda out: out["loss"]
    return lambda out: jnp.where(
        out["consecutive_skips"] >= skip_limit, jnp.nan, jnp.where(out["skip_reason"] > 0, 0.0, out["loss"])
    )


def why_stopped(
    trainer: Any, preemption: Preemption, stopper: EarlyStopping | None, nan_guard: Any, skip_limit: int
) -> str | None:
    """Why the run ended before its last epoch, or ``None``.

    A signal's name, "early stopping", "a NaN loss", "skipped updates" (``skip_limit`` in a row), "terminate()".
    """
    if preemption.saved is not None:
        requested = preemption.requested
        return signal.Signals(requested).name if requested is not None else "a signal on another process"
    if not trainer.should_terminate:
        return None
    if nan_guard.nan_iteration is not None:
        guard = getattr(trainer.state.train_state, "guard", None)
        return "skipped updates" if guard is not None and int(guard.consecutive) >= skip_limit else "a NaN loss"
    if stopper is not None and stopper.counter >= stopper.patience:
        return "early stopping"
    return "terminate()"


def skipped_line(trainer: Any, skip_limit: int) -> str:
    """The line a run the update guard stopped ends with: how many updates in a row, up to where, and why."""
    guard = trainer.state.train_state.guard
    last, consecutive = trainer.state.iteration, int(guard.consecutive)
    why = REASONS.get(int(guard.reason), f"reason {int(guard.reason)}")
    return (
        f"Stopped: {consecutive} updates in a row were skipped (iterations {last - consecutive + 1}-{last}, the last "
        f"for {why}; the limit is {skip_limit}, an epoch's worth): the run is not training. Look at the data and the "
        "learning rate; trainer.rollback_after rolls back to the checkpoint before such a window."
    )


def finished(trainer: Any, cfg: Config) -> bool:
    """Whether the run loaded into ``trainer`` is complete for ``cfg``: a handler ended it, or it reached its end."""
    st = trainer.state
    if trainer.should_terminate:  # loaded from a run a handler ended (early stopping, a NaN): complete
        return True
    if trainer.state_dict().get("epoch_completed") is False:  # stopped at an epoch's last iteration: its end is owed
        return False
    if cfg.trainer.max_iters is not None:
        return st.iteration >= cfg.trainer.max_iters
    return st.epoch_length is not None and st.iteration >= st.epoch_length * cfg.trainer.max_epochs
