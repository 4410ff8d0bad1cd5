"""`MemoryPlan`: a step lowered and compiled ahead of time, and what it needs of each device's memory."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
from jax import lax
from jax.sharding import SingleDeviceSharding

from ember.training._devices.placement import Placement
from ember.training._devices.sharded import traced_build

GiB = 2**30
_STATE_PARTS = ("params", "opt_state", "model_state")


@dataclass(frozen=True)
class MemoryPlan:
    """What one compiled step needs of each device, read from XLA before any step runs.

    The state's bytes come from the shardings (each device's share of every array); the rest is XLA's
    ``memory_analysis()`` of the compiled program and its ``cost_analysis()``. ``peak`` is what the step holds at
    once: its arguments and outputs (less what the donated state lets them share) and its temporaries.

    Attributes:
        step: ``"train"`` or ``"eval"``.
        batch_size: the global batch the step was compiled for (per step).
        devices: the devices the step runs on.
        state: bytes per device of ``params``, ``opt_state``, ``model_state`` and ``other`` (step, RNG, loss scale).
        arguments: XLA's bytes of the step's arguments per device (the state and the batch).
        outputs: bytes of its outputs.
        aliased: bytes of outputs that reuse a donated argument's buffer.
        temporaries: bytes of intermediate values (activations kept for the backward pass, workspace).
        code: bytes of generated code.
        flops: floating-point operations per step per device (XLA's count, which takes a loop's body once: with K
            steps per call, one step's; 0 where the backend gives none).
        limit: the memory a device may use: the ``memory`` budget given, else what the device reports; ``None``
            when neither is known (the CPU backend reports none).

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import TrainState, create_trainer
        >>> state = TrainState.create(lambda p, x: x @ p, jnp.zeros((256, 512)), optax.adam(1e-3))
        >>> trainer = create_trainer(state, lambda model, x: jnp.mean(model(x) ** 2))
        >>> plan = trainer.plan(jnp.ones((64, 256)), memory=2**20)
        >>> plan.state["params"], plan.state["opt_state"], plan.fits
        (524288, 1048580, False)
    """

    step: str
    batch_size: int | None
    devices: int
    state: dict[str, int]
    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    code: int
    flops: float
    limit: int | None

    @property
    def peak(self) -> int:
        """Bytes per device the step holds at once: arguments + outputs - aliased + temporaries."""
        return self.arguments + self.outputs - self.aliased + self.temporaries

    @property
    def fits(self) -> bool | None:
        """Whether `peak` is within `limit` (``None``: no limit known)."""
        return None if self.limit is None else self.peak <= self.limit

    def verdict(self) -> str:
        """One line: whether the step fits, with the numbers.

        Examples:
            >>> from ember.training import MemoryPlan
            >>> plan = MemoryPlan("train", 32, 1, {}, 3 * 2**30, 2**30, 2**30, 2**29, 0, 0.0, 2**32)
            >>> plan.verdict()
            'fits: needs 3.50 GiB of 4.00 GiB per device'
        """
        if self.limit is None:
            return f"needs {_size(self.peak)} per device (no memory limit known here: plan with a budget to compare)"
        word = "fits" if self.fits else "does not fit"
        return f"{word}: needs {_size(self.peak)} of {_size(self.limit)} per device"

    def __str__(self) -> str:
        rows = [(f"state.{name}", n) for name, n in self.state.items()]
        rows += [
            ("arguments", self.arguments),
            ("outputs", self.outputs),
            ("aliased (donated)", -self.aliased),
            ("temporaries", self.temporaries),
            ("peak", self.peak),
            ("generated code", self.code),
        ]
        width = max(len(name) for name, _ in rows)
        batch = "" if self.batch_size is None else f", batch {self.batch_size}"
        lines = [f"{self.step} step on {self.devices} device{'s' if self.devices != 1 else ''}{batch}, per device:"]
        lines += [f"  {name.ljust(width)}  {_size(n):>12}" for name, n in rows]
        lines.append(f"  {'flops'.ljust(width)}  {self.flops:>12.4g}")
        lines.append(self.verdict())
        return "\n".join(lines)


def _size(n: int) -> str:
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit, scale in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{n} B"


def abstract(tree: Any, shardings: Any) -> Any:
    """``tree``'s shapes and dtypes with ``shardings``, as ``jax.ShapeDtypeStruct`` leaves (nothing allocated)."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _shard_bytes(leaf: Any) -> int:
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    return math.prod(shape) * leaf.dtype.itemsize


def state_bytes(state: Any) -> dict[str, int]:
    """Bytes per device of each part of the train state ``state`` (concrete or abstract with shardings)."""
    parts = {name: getattr(state, name) for name in _STATE_PARTS}
    others = state.replace(**dict.fromkeys(_STATE_PARTS))
    counted = {name: sum(_shard_bytes(x) for x in jax.tree.leaves(tree)) for name, tree in parts.items()}
    return {**counted, "other": sum(_shard_bytes(x) for x in jax.tree.leaves(others))}


def device_limit() -> int | None:
    """The bytes a device may use, where the backend reports it (GPU, TPU); ``None`` on CPU."""
    stats = jax.local_devices()[0].memory_stats()
    return None if not stats else stats.get("bytes_limit")


def plan_step(
    kind: str,
    step: Callable[..., Any],
    state: Any,
    batch: Any,
    placement: Placement,
    *,
    steps_per_call: int = 1,
    memory: int | None = None,
) -> MemoryPlan:
    """Lower and compile ``step`` for ``state`` and ``batch`` (abstract: ``ShapeDtypeStruct`` with shardings).

    A train step donates its state and keeps its shardings (as the placements compile it); with ``steps_per_call``
    K > 1 it is the K-step loop over K stacked batches.
    """
    if placement.per_device:
        raise ValueError(
            f"plan() reads one jit-compiled step; under {type(placement).__name__} the step is pmapped: plan the same "
            "model with DataParallel(), which splits the batch over the same devices."
        )
    stacked = kind == "train" and steps_per_call > 1
    batch_sharding = placement.batch_sharding(stacked)
    if isinstance(batch_sharding, jax.Device):  # SingleDevice's
        batch_sharding = SingleDeviceSharding(batch_sharding)
    lead = (steps_per_call,) if stacked else ()
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct((*lead, *x.shape), x.dtype, sharding=batch_sharding), batch)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    if kind == "train":
        one = step

        def pinned(state: Any, batch: Any) -> Any:
            new, out = lax.scan(one, state, batch) if stacked else one(state, batch)
            return lax.with_sharding_constraint(new, shardings), out

        compiled = jax.jit(pinned, donate_argnums=0).lower(state, batch).compile()
    else:
        compiled = jax.jit(step).lower(state, batch).compile()
    memory_stats = compiled.memory_analysis()
    if memory_stats is None:
        raise ValueError(
            f"The {jax.default_backend()} backend gives no memory analysis of a compiled step to plan with."
        )
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, list) else cost) or {}
    sizes = [x.shape[len(lead)] for x in jax.tree.leaves(batch) if len(x.shape) > len(lead)]
    return MemoryPlan(
        step=kind,
        batch_size=sizes[0] if sizes else None,
        devices=len(jax.tree.leaves(shardings)[0].device_set) if jax.tree.leaves(shardings) else 1,
        state=state_bytes(state),
        arguments=int(memory_stats.argument_size_in_bytes),
        outputs=int(memory_stats.output_size_in_bytes),
        aliased=int(memory_stats.alias_size_in_bytes),
        temporaries=int(memory_stats.temp_size_in_bytes),
        code=int(memory_stats.generated_code_size_in_bytes),
        flops=float(cost.get("flops", 0.0)),
        limit=memory if memory is not None else device_limit(),
    )


def resized(batch: Any, size: int) -> Any:
    """``batch``'s structure with every leaf's leading axis ``size`` (``ShapeDtypeStruct`` leaves)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct((size, *x.shape[1:]), x.dtype), batch)


def search_batch(
    fits: Callable[[int], bool], multiple_of: int, largest: int, start: int | None = None
) -> tuple[int | None, list[int]]:
    """The largest multiple of ``multiple_of`` up to ``largest`` for which ``fits`` holds, and the sizes tried.

    From ``start`` (rounded to a multiple; by default ``multiple_of``) it doubles until a size does not fit, or
    halves until one does, then bisects between the last that fit and the first that did not; each size is tried
    once. ``fits`` must not shrink as the batch grows (a step's memory does not).

    Examples:
        >>> from ember.training._devices.plan import search_batch
        >>> search_batch(lambda b: b <= 100, 8, 2**20, start=64)
        (96, [64, 128, 96, 112, 104])
    """
    tried: list[int] = []

    def ok(units: int) -> bool:
        tried.append(units * multiple_of)
        return fits(units * multiple_of)

    top = largest // multiple_of
    if top < 1:
        return None, tried
    units = min(top, max(1, (start or multiple_of) // multiple_of))
    if ok(units):
        low, high = units, None
        while high is None:
            if low == top:
                return low * multiple_of, tried
            if ok(min(2 * low, top)):
                low = min(2 * low, top)
            else:
                high = min(2 * low, top)
    else:
        low, high = 0, units
        while low == 0 and high > 1:
            if ok(high // 2):
                low = high // 2
            else:
                high //= 2
        if low == 0:
            return None, tried
    while high - low > 1:
        mid = (low + high) // 2
        if ok(mid):
            low = mid
        else:
            high = mid
    return low * multiple_of, tried


def engine_plan(engine: Any, batch: Any, memory: int | None) -> MemoryPlan:
    """The plan of ``engine``'s step (a trainer's or an evaluator's) for ``batch``; the state need not exist yet."""
    _check_memory(memory)
    process, placement = engine.process_function, engine.placement
    source = getattr(process, "source", None)  # an evaluator's trainer, whose state it reads
    state = (source or engine).state.train_state
    if state is not None:
        state = abstract(state, jax.tree.map(lambda x: x.sharding, state))
    else:
        factory = (source or engine).state_factory
        if factory is None:
            raise RuntimeError("plan() needs the train state or a factory for it; this engine has neither.")
        with traced_build(placement):
            shapes = jax.eval_shape(factory, batch)  # the state's shapes, nothing allocated
        state = abstract(shapes, placement.state_shardings(shapes))
    k = getattr(process, "steps_per_call", None)  # an evaluator's process has none: one step per call
    kind = "eval" if source is not None or k is None else "train"
    return plan_step(kind, process.step, state, batch, placement, steps_per_call=k or 1, memory=memory)


def engine_max_batch(engine: Any, batch: Any, memory: int | None, multiple_of: int | None, largest: int) -> int | None:
    """The largest global batch (a multiple of ``multiple_of``) whose step fits ``memory``, by compiling only."""
    limit = memory if memory is not None else device_limit()
    if limit is None:
        raise ValueError(
            "max_batch() needs a memory budget: this backend reports no device memory limit; pass memory= (bytes)."
        )
    unit = engine.placement.n_devices if multiple_of is None else multiple_of
    if not isinstance(unit, int) or isinstance(unit, bool) or unit < 1:
        raise ValueError(f"`multiple_of` must be an int >= 1, got {multiple_of!r}.")
    sizes = [x.shape[0] for x in jax.tree.leaves(batch) if len(x.shape)]

    def fits(size: int) -> bool:
        return bool(engine_plan(engine, resized(batch, size), limit).fits)

    return search_batch(fits, unit, largest, start=sizes[0] if sizes else None)[0]


def _check_memory(memory: object) -> None:
    if memory is not None and (not isinstance(memory, int) or isinstance(memory, bool) or memory < 1):
        raise ValueError(f"`memory` must be a number of bytes (an int >= 1) or None, got {memory!r}.")
