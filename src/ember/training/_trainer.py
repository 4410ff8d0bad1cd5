"""`create_trainer` and `create_evaluator`: the factories of training engines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ember.engine import Engine
from ember.training._placement import Placement, Pmap, default_placement
from ember.training._process import EvalProcess, TrainProcess
from ember.training._steps import BoundModel, make_eval_step, make_train_step
from ember.training._train_state import TrainState
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
        raise TypeError(f"`placement` must be SingleDevice(), DataParallel() or Pmap(), got {placement!r}.")
    placement = placement or default_placement()
    if debug and isinstance(placement, Pmap):
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
        state: the initial :class:`TrainState`, or a function building it from the first batch. Its
            arrays are donated to the compiled step (deleted after the first step); the current state
            is ``engine.state.train_state``. Pass ``jax.tree.map(jnp.copy, state)`` to keep yours.
        loss_fn: ``loss_fn(model, batch) -> loss | (loss, aux)``; see :func:`make_train_step`.
        placement: :class:`SingleDevice`, :class:`DataParallel`, :class:`Pmap` or :class:`Sharded`; by
            default data parallel when several devices are visible.
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

    Returns:
        A :class:`TrainingEngine`.

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
    )
    if not callable(state) and not isinstance(state, TrainState):
        raise TypeError(f"`state` must be a TrainState or a function of the first batch, got {type(state).__name__}.")
    process = TrainProcess(step, placement, steps_per_call, debug)
    engine = TrainingEngine(process, placement, prefetch, steps_per_call, debug=debug)
    if isinstance(state, TrainState):
        engine.state.train_state = placement.put_state(state)
    else:
        engine._factory = state
    return engine


def create_evaluator(
    source: TrainState | Engine,
    eval_fn: Callable[[BoundModel, Any], Any],
    *,
    placement: Placement | None = None,
    prefetch: int | None = None,
    debug: bool = False,
) -> TrainingEngine:
    """An engine that evaluates: each iteration runs the compiled ``eval_fn`` with the model in eval mode.

    Args:
        source: a :class:`TrainState`, or the trainer whose current ``state.train_state`` each run uses.
        eval_fn: ``eval_fn(model, batch) -> output``; the output lands in ``state.output``.
        placement: as for :func:`create_trainer`; the trainer's placement is a good choice.
        prefetch: batches kept in flight to the device, as for :func:`create_trainer`.
        debug: run the step uncompiled.

    Returns:
        A :class:`TrainingEngine` (``steps_per_call`` is 1); a short last batch is accepted.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import TrainState, create_evaluator
        >>> state = TrainState.create(lambda p, x: x * p, jnp.array(3.0), optax.sgd(0.1))
        >>> evaluator = create_evaluator(state, lambda model, x: model(x))
        >>> evaluator.run([jnp.ones(2), jnp.ones(1)]).output.tolist()
        [3.0]
    """
    placement, prefetch = _check_options(1, prefetch, placement, debug)
    if not isinstance(source, TrainState | Engine):
        raise TypeError(f"`source` must be a TrainState or a trainer Engine, got {type(source).__name__}.")
    trainer = None if isinstance(source, TrainState) else source
    process = EvalProcess(make_eval_step(eval_fn), placement, trainer, debug)
    engine = TrainingEngine(process, placement, prefetch, 1, debug=debug)
    engine.pads_batches = True
    if isinstance(source, TrainState):
        engine.state.train_state = placement.put_state(source)
    return engine
