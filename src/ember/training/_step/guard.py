"""`StepGuard`: updates that are not applied when their loss or gradients are not finite, or spike."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct


def all_finite(tree: Any) -> jax.Array:
    """One boolean scalar: whether every floating value of ``tree`` is finite (no NaN, no infinity).

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.training._step.guard import all_finite
        >>> bool(all_finite({"a": jnp.ones(2), "b": jnp.array([1.0, jnp.inf])}))
        False
    """
    checks = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.stack(checks).all() if checks else jnp.array(True)


def keep_if(ok: jax.Array, new: Any, old: Any) -> Any:
    """``new`` where the scalar ``ok`` holds, ``old`` elsewhere, leaf by leaf, inside a compiled step (no host read).

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.training._step.guard import keep_if
        >>> keep_if(jnp.array(False), {"w": jnp.ones(2)}, {"w": jnp.zeros(2)})["w"].tolist()
        [0.0, 0.0]
    """
    return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)


class StepGuard(struct.PyTreeNode):
    """What ``create_trainer(..., skip_nonfinite=True)`` keeps in ``TrainState.guard`` to decide on each update.

    Inside the compiled step, with no host read, an update is skipped (parameters, optimizer state and its
    moments, model state and the step counter left as they were) when the loss or a gradient is not finite, or,
    with ``spike_factor``, when the loss or the gradients' global norm exceeds ``spike_factor`` times its running
    average (an exponential average over applied steps, decay ``0.99``, checked once ``warmup`` steps have
    been averaged). The counts are in the train state, so a checkpoint saves them and a resumed run goes on
    counting.

    Attributes:
        skipped: steps skipped over the whole run.
        consecutive: steps skipped in a row, up to the last step (0 after an applied one).
        reason: why the last step was skipped: 1 a non-finite loss, 2 a non-finite gradient, 3 a loss spike, 4 a
            gradient-norm spike; 0 if it was applied.
        loss_avg: the running average of the loss over applied steps.
        norm_avg: the running average of the gradients' global norm over applied steps.
        averaged: applied steps in the averages.
        spike_factor: ``None`` (non-finite values only), or the factor over the running average that is a spike.
        warmup: applied steps averaged before a spike can be called.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.training import StepGuard
        >>> guard = StepGuard.create(spike_factor=3.0, warmup=1)
        >>> for loss in (1.0, 2.0, 9.0, jnp.nan):
        ...     reason = guard.check(jnp.asarray(loss), jnp.asarray(True), jnp.asarray(1.0))
        ...     guard = guard.update(reason, jnp.asarray(loss), jnp.asarray(1.0))
        ...     print(int(reason), int(guard.skipped), int(guard.consecutive))
        0 0 0
        0 0 0
        3 1 1
        1 2 2
    """

    skipped: jax.Array
    consecutive: jax.Array
    reason: jax.Array
    loss_avg: jax.Array
    norm_avg: jax.Array
    averaged: jax.Array
    spike_factor: float | None = struct.field(pytree_node=False, default=None)
    warmup: int = struct.field(pytree_node=False, default=10)

    @classmethod
    def create(cls, spike_factor: float | None = None, warmup: int = 10) -> StepGuard:
        """A guard with nothing counted yet.

        Examples:
            >>> from ember.training import StepGuard
            >>> int(StepGuard.create().skipped)
            0
        """
        if spike_factor is not None and (
            not isinstance(spike_factor, int | float) or isinstance(spike_factor, bool) or not spike_factor > 1
        ):
            raise ValueError(f"`spike_factor` must be None or a number > 1, got {spike_factor!r}.")
        if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 1:
            raise ValueError(f"`warmup` must be an int >= 1, got {warmup!r}.")

        def count() -> jax.Array:  # one buffer for each: the state is donated
            return jnp.zeros((), jnp.int32)

        def average() -> jax.Array:
            return jnp.zeros((), jnp.float32)

        return cls(count(), count(), count(), average(), average(), count(), spike_factor=spike_factor, warmup=warmup)

    def check(self, loss: jax.Array, grads_finite: jax.Array, norm: jax.Array) -> jax.Array:
        """This step's skip reason (int32; 0: apply the update) from its loss, gradients and gradient norm."""
        reason = jnp.where(~jnp.isfinite(loss), 1, jnp.where(~grads_finite, 2, 0))
        if self.spike_factor is not None:
            armed = self.averaged >= self.warmup
            spike_loss = armed & (loss > self.spike_factor * self.loss_avg)
            spike_norm = armed & (norm > self.spike_factor * self.norm_avg)
            reason = jnp.where(reason > 0, reason, jnp.where(spike_loss, 3, jnp.where(spike_norm, 4, 0)))
        return reason.astype(jnp.int32)

    def update(self, reason: jax.Array, loss: jax.Array, norm: jax.Array) -> StepGuard:
        """The guard after a step whose skip reason was ``reason``: counts, and averages over applied steps."""
        ok = reason == 0

        def average(avg: jax.Array, value: jax.Array) -> jax.Array:
            first = self.averaged == 0
            new = jnp.where(first, value, 0.99 * avg + 0.01 * value).astype(jnp.float32)
            return jnp.where(ok, new, avg)

        return self.replace(
            skipped=self.skipped + (~ok).astype(jnp.int32),
            consecutive=jnp.where(ok, 0, self.consecutive + 1).astype(jnp.int32),
            reason=reason,
            loss_avg=average(self.loss_avg, loss),
            norm_avg=average(self.norm_avg, norm),
            averaged=self.averaged + ok.astype(jnp.int32),
        )

    def outputs(self) -> dict[str, Any]:
        """What the step reports: ``skipped`` (in all), ``skip_reason`` and ``consecutive_skips`` (of this step)."""
        return {"skipped": self.skipped, "skip_reason": self.reason, "consecutive_skips": self.consecutive}

    def settle(self, before: Any, proposed: Any, loss: jax.Array, grads: Any) -> tuple[Any, dict[str, Any]]:
        """The train state after a step, and what the step reports of it (`outputs`).

        ``proposed`` (the optimizer's update applied) if the update is kept; otherwise ``before``, as it was. Either
        way the state holds this guard with the step counted.

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from ember.training import StepGuard, TrainState
            >>> state = TrainState.create(lambda p, x: p * x, jnp.ones(2), optax.sgd(1.0))
            >>> state = state.replace(guard=StepGuard.create())
            >>> grads = jnp.array([1.0, jnp.nan])
            >>> kept, said = state.guard.settle(state, state.apply_gradients(grads), jnp.float32(1.0), grads)
            >>> kept.params.tolist(), int(kept.step), int(said["skip_reason"])
            ([1.0, 1.0], 0, 2)
        """
        norm = optax.tree.norm(grads)
        reason = self.check(loss, all_finite(grads), norm)
        guard = self.update(reason, loss, norm)
        return keep_if(reason == 0, proposed, before).replace(guard=guard), guard.outputs()
