"""The process functions of trainers and evaluators: compile the step once per shape of work, and call it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.extend.core import ClosedJaxpr, Jaxpr

from ember.data import Masked
from ember.training._auto_prefetch import auto_prefetch
from ember.training._batch_spec import BatchSpec
from ember.training._devices.padding import merge_device_axis, with_mask
from ember.training._devices.placement import Placement
from ember.training._feed import StepGroups
from ember.training._fused import FusedMetrics
from ember.training._step_output import StepOutput
from ember.training._training_engine import TrainingEngine


class TrainProcess:
    """A trainer's ``process_fn``: runs the compiled train step on ``engine.state.train_state``.

    One compilation per (steps in the call, set of fused metrics); with K steps per call, one call at
    the first iteration of each group, whose stacked outputs the group's iterations then read in turn.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import TrainState, create_trainer
        >>> state = TrainState.create(lambda p, x: x * p, jnp.array(1.0), optax.sgd(0.1))
        >>> trainer = create_trainer(state, lambda m, b: jnp.mean(m(b) ** 2))
        >>> type(trainer.process_function).__name__
        'TrainProcess'
    """

    def __init__(self, step: Callable[..., Any], placement: Placement, steps_per_call: int, debug: bool) -> None:
        self.step, self.placement, self.steps_per_call, self.debug = step, placement, steps_per_call, debug
        self.fusion = FusedMetrics()  # the metric updates folded into the step; its engine attaches them here
        self.compiled: dict[tuple[int, int], Callable[..., Any]] = {}  # by (group size, fused-metrics version)
        self.spec: BatchSpec | None = None  # the first batch's structure, shapes and dtypes
        self.outputs: Any = None  # the current K-step call's stacked outputs

    def compile_for(self, engine: TrainingEngine, size: int, batch: Any) -> Callable[..., Any]:
        """The step for ``size`` steps per call with the engine's fused metrics, compiled on first use.

        The step checks its batch against the first one when JAX traces it (`BatchSpec`), so only a batch
        of a shape not compiled for yet is checked, before XLA compiles for it.
        """
        fusion, key = self.fusion, (size, self.fusion.version)
        fn = self.compiled.get(key)
        if fn is not None:
            return fn
        grouped, train_state = self.steps_per_call > 1, engine.state.train_state
        fn = fusion.wrap(self.step) if fusion.metrics else self.step
        if grouped:
            carry = (train_state, tuple(m.state for m in fusion.metrics)) if fusion.metrics else train_state
            unroll = _platform(train_state) == "cpu" and _convolves(fn, self.placement, carry, batch)
            fn = _scan_k(fn, unroll=unroll)
            if fusion.metrics:
                fn = fusion.split_published(fn, size)
        fn = _checked(fn, lambda batch: self.spec.check(batch))  # type: ignore[union-attr]  # set before the first call
        if not self.debug:
            example = _example_output(self.step, self.placement, train_state, batch, stacked=grouped)
            fn = self.placement.compile_train(fn, example, stacked=grouped)
        self.compiled[key] = fn
        return fn

    def call(self, engine: TrainingEngine, batch: Any, size: int) -> Any:
        """Run the step (``size`` steps) on the train state and the fused metrics' states; the new ones replace them."""
        st, fusion = engine.state, self.fusion
        if self.spec is None:  # a short last batch passes (one more compilation); so does a short last group
            if isinstance(batch, Masked) or isinstance(getattr(engine.state, "batch", None), Masked):
                raise TypeError(
                    "A trainer cannot take a Masked batch (an evaluation set's part, padded): build the training data "
                    "with drop_remainder=True, so every process gets an equal part of every batch."
                )
            grouped, per_device = self.steps_per_call > 1, self.placement.per_device
            self.spec = BatchSpec(batch, stacked=grouped, allow_short=not grouped, per_device=per_device)
        else:
            self.spec.check_dtypes(batch)  # the one change of batch that JAX itself would let through
        fn = self.compile_for(engine, size, batch)
        if fusion.metrics:
            st.train_state, out = fusion.call(fn, st.train_state, batch, steps=self.steps_per_call)
        else:
            st.train_state, out = fn(st.train_state, batch)
        return out

    def __call__(self, engine: TrainingEngine, batch: Any) -> Any:
        if engine.state.train_state is None:
            engine.build_state(batch)
        if self.steps_per_call == 1:
            return self.call(engine, batch, 1)
        # the ignore below: with K steps per call the engine's data is always the StepGroups feeder
        feeder: StepGroups = engine.state.dataloader  # type: ignore[assignment]
        if feeder.slot == 0:
            self.outputs = self.call(engine, feeder.group, feeder.size)
        if self.fusion.metrics:
            self.fusion.give(feeder.slot)
        return StepOutput(self.outputs, feeder.slot)


class EvalProcess:
    """An evaluator's ``process_fn``: runs the compiled eval step on the source's current train state.

    ``source``: the trainer whose current train state each call uses, or ``None`` for the evaluator's own. A batch that
    does not split over the devices comes padded, with a mask of its real examples
    (`PaddedBatches`); it compiles once more. Each run's data may have batches of
    its own shape (the train set in 64s, the validation set in 1000s): the step compiles once per shape, and
    keeps each compilation; within one run every batch must match the first (a short last one aside).

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import TrainState, create_evaluator
        >>> state = TrainState.create(lambda p, x: x * p, jnp.array(1.0), optax.sgd(0.1))
        >>> type(create_evaluator(state, lambda m, b: m(b)).process_function).__name__
        'EvalProcess'
    """

    def __init__(self, step: Callable[..., Any], placement: Placement, source: Any, debug: bool) -> None:
        self.step, self.placement, self.source, self.debug = step, placement, source, debug
        self.fusion = FusedMetrics()  # the metric updates folded into the step; its engine attaches them here
        self.compiled: dict[tuple[int, bool], Callable[..., Any]] = {}  # by fused-metrics version, padded or not
        self.spec: BatchSpec | None = None
        self.spec_data: Any = None  # the data (as the engine iterates it) whose first batch made ``spec``

    def masked_step(self, state: Any, padded: Any) -> Any:
        """The step on a padded batch ``(batch, mask of the real examples)``."""
        return with_mask(self.step(state, padded[0]), padded[1], self.placement.n_devices)

    def compile_for(self, engine: TrainingEngine, padded: bool) -> Callable[..., Any]:
        """The eval step (padded or not) with the engine's fused metrics, compiled on first use."""
        fusion = self.fusion
        fn = self.compiled.get((fusion.version, padded))
        if fn is None:
            one = self.masked_step if padded else self.step
            fn = fusion.wrap(lambda state, batch: (state, one(state, batch))) if fusion.metrics else one
            examples: Callable[[Any], Any] = (lambda batch: batch[0]) if padded else (lambda batch: batch)
            # the ignore below: the spec is set before any step is compiled
            fn = _checked(fn, lambda batch: self.spec.check(examples(batch)))  # type: ignore[union-attr]
            fn = self.compiled[fusion.version, padded] = fn if self.debug else self.placement.compile_eval(fn)
        return fn

    def precompile(self, engine: TrainingEngine, batch: Any) -> Callable[[], bool] | None:
        """How to compile the eval step for ``batch`` as the first call of a run will, or ``None`` where it cannot.

        The shapes and placements (the train state's, the fused metrics', the batch's as the run will place it) are
        taken now, on the calling thread; the returned function compiles from them alone, on any thread, and the
        first real call then finds the program in JAX's caches. ``None``: a per-device placement, a batch the run
        would pad or one the data masks, a placement that wraps its compiled call, or ``debug``.
        """
        placement, train_state = self.placement, (engine if self.source is None else self.source).state.train_state
        leaves = jax.tree.leaves(train_state)
        if self.debug or not leaves or placement.per_device or isinstance(batch, Masked):
            return None
        if any(np.shape(x)[:1] and np.shape(x)[0] % placement.n_devices for x in jax.tree.leaves(batch)):
            return None  # a batch the run pads to split over the devices: its own program, compiled in the run
        ahead = engine.prefetch if engine.prefetch is not None else auto_prefetch(batch, placement)
        placed = (placement.put_batch if ahead else placement.prepare_batch)(batch)
        fusion, state_shapes = self.fusion, jax.tree.map(_shape_of, train_state)
        args: Any = state_shapes
        if fusion.metrics:  # `FusedMetrics.call` places a run's fresh states as the state's first leaf is placed
            sharding = leaves[0].sharding
            states = jax.tree.map(lambda x: _shape_of(x, sharding), tuple(m.state for m in fusion.metrics))
            args = (state_shapes, states)
        shapes = (args, jax.tree.map(_shape_of, placed))
        if self.spec is None:  # the batch check runs as the step is traced
            self.spec = BatchSpec(batch, allow_short=True, per_device=False)
        fn = self.compile_for(engine, padded=False)
        lower = getattr(fn, "lower", None)  # a placement that awaits each call wraps the jitted step: not lowered
        if lower is None:
            return None

        def compile_now() -> bool:
            lower(*shapes).compile()
            return True

        return compile_now

    def __call__(self, engine: TrainingEngine, batch: Any) -> Any:
        padded = engine.padding is not None and engine.padding.padded.popleft()
        if self.spec_data is not engine.state.dataloader:  # each run's data: its own shapes
            examples = batch[0] if padded else batch
            per_device = self.placement.per_device
            self.spec, self.spec_data = (
                BatchSpec(examples, allow_short=True, per_device=per_device),
                engine.state.dataloader,
            )
        train_state = (engine if self.source is None else self.source).state.train_state
        fn = self.compile_for(engine, padded)
        out = self.fusion.call(fn, train_state, batch)[1] if self.fusion.metrics else fn(train_state, batch)
        return merge_device_axis(out) if self.placement.per_device else out


def _shape_of(x: Any, sharding: Any = None) -> Any:
    """``x`` as a compiled call sees it: shape, dtype, and the sharding it is placed with.

    That is ``sharding`` if given, else a device array's own; a host array has none (the call places it).
    """
    if sharding is None and isinstance(x, jax.Array):
        sharding = x.sharding
    return jax.ShapeDtypeStruct(np.shape(x), jax.numpy.result_type(x), sharding=sharding)


def _checked(step: Callable[..., Any], check: Callable[[Any], None]) -> Callable[..., Any]:
    """``step`` that runs ``check(batch)`` first: once per trace when compiled, every call when not (``debug``)."""

    @functools.wraps(step)  # compiles under the step's name: jit(fused), jit(train_step)
    def checked(state: Any, batch: Any) -> Any:
        check(batch)
        return step(state, batch)

    return checked


def _platform(train_state: Any) -> str:
    """The platform (``"cpu"``, ``"gpu"``, ``"tpu"``) the train state lives on."""
    leaves = jax.tree.leaves(train_state)
    return next(iter(leaves[0].devices())).platform if leaves and isinstance(leaves[0], jax.Array) else "cpu"


def _scan_k(step: Callable[..., Any], *, unroll: bool) -> Callable[..., Any]:
    """K steps in one call (``lax.scan``); outputs come back stacked, and each step's view slices only what is read.

    ``unroll``: on the CPU backend, for a step with convolutions, which XLA:CPU runs about 10x slower inside a
    loop; unrolling costs compilation about K times over, so everything else, and every accelerator, keeps the
    loop (docs/benchmarks.md, "Hot-path mechanisms").
    """

    def multi(state: Any, group: Any) -> Any:
        return lax.scan(step, state, group, unroll=unroll)

    return multi


def _convolves(step: Callable[..., Any], placement: Placement, carry: Any, group: Any) -> bool:
    """Whether the K-step loop of ``step`` over the stacked ``group`` contains a convolution (traced; nothing runs).

    The loop is traced as the compiled call traces it (the same body, carry and group), so JAX's trace cache
    gives the compilation this trace of the body instead of tracing the model a second time.
    """

    def found(jaxpr: Any) -> bool:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "conv_general_dilated":
                return True
            for value in eqn.params.values():  # the bodies of scan, jit, remat, custom_vjp, cond ...
                for sub in value if isinstance(value, tuple | list) else (value,):
                    if isinstance(sub, ClosedJaxpr | Jaxpr) and found(getattr(sub, "jaxpr", sub)):
                        return True
        return False

    if placement.per_device:  # (devices, K, B/devices, ...): one step's per-device batches, vmapped
        one = jax.tree.map(lambda x: x[:, 0], group)
        traced = jax.make_jaxpr(jax.vmap(step, in_axes=(None, 0), axis_name=placement.axis_name))(carry, one)
    else:
        traced = jax.make_jaxpr(lambda c, g: lax.scan(step, c, g))(carry, group)
    return found(traced.jaxpr)


def _example_output(
    step: Callable[..., Any], placement: Placement, train_state: Any, batch: Any, *, stacked: bool
) -> Any:
    """The per-device output structure of one step; only a per-device placement (``Pmap``) needs it (out_axes)."""
    if not placement.per_device:
        return None
    one = jax.tree.map(lambda x: x[:, 0] if stacked else x, batch)  # (n, B/n, ...): one step's per-device batch
    shapes = jax.eval_shape(jax.vmap(step, in_axes=(None, 0), axis_name=placement.axis_name), train_state, one)[1]
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), shapes)
