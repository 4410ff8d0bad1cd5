"""`create_trainer` and `create_evaluator`: the factories of training engines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ember.engine import Engine
from ember.training._devices.placement import Placement, default_placement
from ember.training._process import EvalProcess, TrainProcess
from ember.training._step.ema import ema_params, with_ema_params
from ember.training._step.guard import StepGuard
from ember.training._step.precision import policy, stored
from ember.training._step.steps import BoundModel, make_eval_step, make_train_step
from ember.training._train_state import TrainState, as_train_state, is_flax_train_state
from ember.training._training_engine import TrainingEngine


def _check_options(
    steps_per_call: int, prefetch: int | None, placement: Placement | None, debug: bool
) -> tuple[Placement, int | None]:
    for name, value, low in (("steps_per_call", steps_per_call, 1), ("prefetch", prefetch, 0)):
        if name == "prefetch" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"`{name}` must be an int >= {low}, got {value!r}.")
    if placement is not None and not isinstance(placement, Placement):
        raise TypeError(
            f"`placement` must be a Placement (SingleDevice(), DataParallel(), Pmap(), Sharded(...)), "
            f"got {placement!r}."
        )
    placement = placement or default_placement()
    if debug and placement.per_device:
        raise ValueError("debug=True runs the step uncompiled on one device; use SingleDevice() to debug.")
    return placement, prefetch


def create_trainer(
    state: TrainState | Callable[[Any], TrainState],
    loss_fn: Callable[[BoundModel, Any], Any],
    *,
    placement: Placement | None = None,
    steps_per_call: int = 1,
    accumulate_steps: int = 1,
    extras: Sequence[str] = (),
    lr_schedule: Callable[[Any], Any] | None = None,
    prefetch: int | None = None,
    debug: bool = False,
    remat: str | None = None,
    precision: str = "32-true",
    skip_nonfinite: bool = False,
    spike_factor: float | None = None,
) -> TrainingEngine:
    """An engine that trains: each iteration runs the compiled step on ``engine.state.train_state``.

    The step's output (``{"loss": ..., **aux, **extras}``, device arrays) lands in ``state.output``
    untouched; nothing is read back to the host unless a handler asks. Batches go straight into the compiled
    call, which transfers them more cheaply than an explicit ``device_put``, unless they are large enough
    (on an accelerator) to gain from being put on device ``prefetch`` steps ahead. The first batch's
    structure, shapes and dtypes are recorded. A shorter last batch (``ArrayDataset``'s default
    ``drop_remainder=False``) is trained on, at the cost of one more compilation for its shape, as torch's
    ``DataLoader`` and Keras ``fit`` do; with ``steps_per_call`` > 1, or on several devices when it does not
    divide over them, it is refused (pass ``drop_remainder=True``). Any other difference raises an error
    showing both batches.

    Args:
        state: the initial [`TrainState`][ember.training.TrainState] (or a ``flax.training.train_state.TrainState``,
            converted by [`TrainState.from_flax`][ember.training.TrainState.from_flax]), or a function building it from
            the first batch. Its arrays are donated to the compiled step (deleted after the first step); the current
            state is ``engine.state.train_state``. Pass ``jax.tree.map(jnp.copy, state)`` to keep yours.
        loss_fn: ``loss_fn(model, batch) -> loss | (loss, aux)``; see
            [`make_train_step`][ember.training.make_train_step].
        placement: [`SingleDevice`][ember.training.SingleDevice], [`DataParallel`][ember.training.DataParallel],
            [`Pmap`][ember.training.Pmap] or [`Sharded`][ember.training.Sharded]; by default data parallel when several
            devices are visible.
        steps_per_call: run K steps per compiled call (``lax.scan`` over K stacked batches). On the CPU
            backend a step with convolutions is unrolled instead (XLA:CPU runs convolutions inside a loop
            about 10x slower), which takes about K times longer to compile.
        accumulate_steps: micro-batches per optimizer update.
        extras: in-step values for handlers (``"grad_norm"``, ``"update_norm"``, ``"param_norm"``, ``"lr"``).
        lr_schedule: the optimizer's schedule, for the ``"lr"`` extra.
        prefetch: batches (or K-step groups) kept in flight to the device; 0 hands each batch to the
            compiled call as it comes. ``None`` (default) decides from the first batch of each pass: 2 on
            an accelerator when one call's batch holds at least ``PREFETCH_MIN_BYTES`` (1.5 MiB) of host
            data, else 0 (always 0 on a CPU backend); below that size ``jax.device_put`` costs more than
            it hides.
        debug: run the step uncompiled, to step through it with a debugger.
        remat: recompute the forward pass in the backward pass instead of keeping its intermediates, by
            JAX's checkpoint policy name (``"full"``, ``"dots_saveable"``, ...; see
            [`make_train_step`][ember.training.make_train_step]): less memory, more compute, the same numbers.
        precision: Lightning's names: ``"32-true"`` (default, as the state was built); ``"bf16-mixed"`` (the loss
            function computes in bfloat16; the parameters, the optimizer state and the reported values stay float32);
            ``"bf16-true"`` (the state's floating arrays are stored in bfloat16 too: half the memory); ``"16-mixed"``
            (float16 compute with a [`DynamicLossScale`][ember.training.DynamicLossScale] in ``state.loss_scale``;
            a step whose loss or gradients overflow is skipped, by the guard ``skip_nonfinite`` adds; ``"loss_scale"``
            in the output). See
            ``docs/concepts/precision.md``.
        skip_nonfinite: put a [`StepGuard`][ember.training.StepGuard] in the train state: inside the compiled step an
            update whose loss or gradients are not finite is not applied (parameters, optimizer state, model state
            and ``state.step`` unchanged), and the output says so (``"skipped"``, ``"skip_reason"``,
            ``"consecutive_skips"``). See [`RollbackOnDivergence`][ember.handlers.RollbackOnDivergence].
        spike_factor: with ``skip_nonfinite``, also skip an update whose loss or gradients' global norm exceeds this
            factor times its running average.

    Returns:
        A [`TrainingEngine`][ember.training.TrainingEngine].

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import TrainState, create_trainer
        >>> state = TrainState.create(lambda p, x: x @ p, jnp.zeros(2), optax.sgd(0.1))
        >>> def loss_fn(model, batch):
        ...     x, y = batch
        ...     return jnp.mean((model(x) - y) ** 2)
        >>> data = [(jnp.eye(2), jnp.array([1.0, -1.0]))] * 4
        >>> trainer = create_trainer(state, loss_fn)
        >>> round(float(trainer.run(data, max_epochs=25).output["loss"]), 4)
        0.0
    """
    placement, prefetch = _check_options(steps_per_call, prefetch, placement, debug)
    step = make_train_step(
        loss_fn,
        accumulate_steps=accumulate_steps,
        extras=extras,
        lr_schedule=lr_schedule,
        axis_name=placement.axis_name,
        remat=remat,
        precision=precision,
    )
    rule = policy(precision)
    if not isinstance(skip_nonfinite, bool):
        raise TypeError(f"`skip_nonfinite` must be True or False, got {skip_nonfinite!r}.")
    if spike_factor is not None and not skip_nonfinite:
        raise ValueError(
            f"`spike_factor` needs skip_nonfinite=True (a spike is skipped as a NaN is); got {spike_factor!r}."
        )
    guard = StepGuard.create(spike_factor) if skip_nonfinite else None
    if not callable(state) or is_flax_train_state(state):
        state = as_train_state(state, "state", ", or a function of the first batch returning one")
    process = TrainProcess(step, placement, steps_per_call, debug)
    factory = None if isinstance(state, TrainState) else _stored_by(state, rule, guard)
    engine = TrainingEngine(
        process, placement, prefetch, steps_per_call, debug=debug, fusion=process.fusion, factory=factory
    )
    if isinstance(state, TrainState):
        engine.state.train_state = placement.put_state(stored(state, rule, guard))
    return engine


def _stored_by(factory: Callable[[Any], Any], rule: Any, guard: StepGuard | None) -> Callable[[Any], Any]:
    """``factory`` whose state is stored as the precision policy ``rule`` keeps it, with ``guard`` if any."""

    def build(batch: Any) -> Any:
        built = factory(batch)
        return stored(built, rule, guard) if isinstance(built, TrainState) else built  # anything else: refused later

    return build


def create_evaluator(
    source: TrainState | Engine,
    eval_fn: Callable[[BoundModel, Any], Any],
    *,
    placement: Placement | None = None,
    prefetch: int | None = None,
    debug: bool = False,
    use_ema: bool = False,
    precision: str = "32-true",
) -> TrainingEngine:
    """An engine that evaluates: each iteration runs the compiled ``eval_fn`` with the model in eval mode.

    Args:
        source: a [`TrainState`][ember.training.TrainState], or the trainer whose current ``state.train_state`` each run
            uses.
        eval_fn: ``eval_fn(model, batch) -> output``; the output lands in ``state.output``.
        placement: as for [`create_trainer`][ember.training.create_trainer]; the trainer's placement is a good choice.
        prefetch: batches kept in flight to the device, as for [`create_trainer`][ember.training.create_trainer].
        debug: run the step uncompiled.
        precision: as the trainer's (see [`make_train_step`][ember.training.make_train_step]): the model computes
            in the policy's dtype (no loss scale: nothing is differentiated); floating outputs come back float32.
        use_ema: evaluate the average of the parameters that an optimizer wrapped in
            [`ema`][ember.training.ema] keeps, instead of the parameters (inside the compiled step).

    Returns:
        A [`TrainingEngine`][ember.training.TrainingEngine] (``steps_per_call`` is 1); a short last batch is accepted.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import TrainState, create_evaluator
        >>> state = TrainState.create(lambda p, x: x * p, jnp.array(3.0), optax.sgd(0.1))
        >>> evaluator = create_evaluator(state, lambda model, x: model(x))
        >>> evaluator.run([jnp.ones(2), jnp.ones(1)]).output.tolist()
        [3.0]
    """
    placement, prefetch = _check_options(1, prefetch, placement, debug)
    if not isinstance(source, Engine):
        source = as_train_state(source, "source", ", or a trainer Engine")
    trainer = None if isinstance(source, TrainState) else source
    if not isinstance(use_ema, bool):
        raise TypeError(f"`use_ema` must be True or False, got {use_ema!r}.")
    step = make_eval_step(eval_fn, precision=precision)
    if use_ema:
        state = source if isinstance(source, TrainState) else getattr(source.state, "train_state", None)
        if state is not None:  # refused now, not at the first evaluation (a lazy state: then)
            ema_params(state)
        step = _on_average(step)
    process = EvalProcess(step, placement, trainer, debug)
    engine = TrainingEngine(process, placement, prefetch, 1, debug=debug, fusion=process.fusion)
    engine.pads_batches = True
    if isinstance(source, TrainState):
        engine.state.train_state = placement.put_state(source)
    return engine


def _on_average(step: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``step`` run on the state's averaged parameters (``use_ema=True``)."""

    def on_average(state: Any, batch: Any) -> Any:
        return step(with_ema_params(state), batch)

    return on_average
