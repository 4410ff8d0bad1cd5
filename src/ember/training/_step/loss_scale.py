"""`DynamicLossScale`: float16's loss scaling, kept in the train state so checkpoints carry it."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from ember.training._step.guard import all_finite


class DynamicLossScale(struct.PyTreeNode):
    """The dynamic loss scale of ``precision="16-mixed"``: grows after a run of finite steps, halves on overflow.

    float16 holds nothing below about 6e-8, so small gradients vanish; the step multiplies the loss by ``scale``
    before differentiating and divides the gradients by it after. A step whose loss or gradients are not finite
    (the scale was too large) is skipped, by the [`StepGuard`][ember.training.StepGuard] the policy adds
    (parameters, optimizer state, model state and step counter stay as they were), and the scale halves. After
    ``period`` finite steps in a row the scale doubles. The rule is PyTorch's ``GradScaler``'s (its defaults but
    the first scale: 2**15, since 2**16 is already infinite in float16). It lives in
    ``TrainState.loss_scale``, so a checkpoint saves it and a resumed run continues with the same scale.

    Attributes:
        scale: the factor the loss is multiplied by (float32).
        good_steps: finite steps since the scale last changed (int32).
        period: finite steps after which the scale doubles.
        minimum: the scale never halves below this.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.training import DynamicLossScale
        >>> scale = DynamicLossScale.create(initial=8.0, period=2)
        >>> for finite in (True, True, False):
        ...     scale = scale.adjust(jnp.array(finite))
        ...     print(float(scale.scale))
        8.0
        16.0
        8.0
    """

    scale: jax.Array
    good_steps: jax.Array
    period: int = struct.field(pytree_node=False, default=2000)
    minimum: float = struct.field(pytree_node=False, default=1.0)

    @classmethod
    def create(cls, initial: float = 2.0**15, period: int = 2000, minimum: float = 1.0) -> DynamicLossScale:
        """A loss scale starting at ``initial``, doubling after ``period`` finite steps, never below ``minimum``.

        Examples:
            >>> from ember.training import DynamicLossScale
            >>> float(DynamicLossScale.create().scale)
            32768.0
        """
        for name, value in (("initial", initial), ("minimum", minimum)):
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"`{name}` must be a positive number, got {value!r}.")
        if not isinstance(period, int) or isinstance(period, bool) or period < 1:
            raise ValueError(f"`period` must be an int >= 1, got {period!r}.")
        return cls(
            scale=jnp.asarray(initial, jnp.float32),
            good_steps=jnp.zeros((), jnp.int32),
            period=period,
            minimum=float(minimum),
        )

    def adjust(self, finite: jax.Array) -> DynamicLossScale:
        """The scale for the next step, after a step whose gradients were ``finite`` (a boolean scalar).

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember.training import DynamicLossScale
            >>> float(DynamicLossScale.create(initial=4.0).adjust(jnp.array(False)).scale)
            2.0
        """
        grown = self.good_steps + 1 >= self.period
        scale = jnp.where(
            finite, jnp.where(grown, self.scale * 2, self.scale), jnp.maximum(self.scale / 2, self.minimum)
        )
        good = jnp.where(finite & ~grown, self.good_steps + 1, 0)
        return self.replace(scale=scale, good_steps=good)

    def settle(self, before: Any, proposed: Any, loss: jax.Array, grads: Any) -> tuple[Any, dict[str, Any]]:
        """``proposed`` holding the scale for the next step, and what the step reports: the scale it used.

        The scale halves when the loss or the gradients overflowed (not on a spike the guard skips), and grows after a
        run of finite steps; ``before`` is the state the step began from (it is not needed: the scale is this one).

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from ember.training import DynamicLossScale, TrainState
            >>> state = TrainState.create(lambda p, x: p * x, jnp.ones(2), optax.sgd(1.0))
            >>> state = state.replace(loss_scale=DynamicLossScale.create(initial=4.0))
            >>> grads = jnp.array([jnp.inf, 0.0])
            >>> new, said = state.loss_scale.settle(state, state, jnp.float32(1.0), grads)
            >>> float(new.loss_scale.scale), float(said["loss_scale"])
            (2.0, 4.0)
        """
        del before
        finite = all_finite(grads) & jnp.isfinite(loss)
        return proposed.replace(loss_scale=self.adjust(finite)), {"loss_scale": self.scale}
