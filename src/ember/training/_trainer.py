"""`create_trainer` and `create_evaluator`: engines that run a compiled step on a train state."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from ember.data import DevicePrefetch
from ember.engine import Engine, Events, State
from ember.training._batch_spec import BatchSpec
from ember.training._feed import StepGroups
from ember.training._flat_tree import flatten_tree, unflatten_like
from ember.training._fused import FusedMetrics
from ember.training._padding import PaddedBatches, merge_device_axis, with_mask
from ember.training._placement import Placement, Pmap, default_placement
from ember.training._step_output import StepOutput
from ember.training._steps import BoundModel, make_eval_step, make_train_step
from ember.training._train_state import TrainState


class TrainingState(State):
    """The :class:`~ember.State` of a training engine, plus the train state it runs the step on.

    Attributes:
        train_state: the current :class:`TrainState` (on device); ``None`` until built for a lazy state.

    Examples:
        >>> from ember.training import TrainingState
        >>> TrainingState().train_state is None
        True
    """

    def __init__(self) -> None:
        super().__init__()
        self.train_state: Any = None


class TrainingEngine(Engine):
    """An :class:`~ember.Engine` whose data is put on device ahead of the step that needs it.

    Built by :func:`create_trainer` and :func:`create_evaluator`; ``engine.state.train_state`` holds the
    state the compiled step reads. With ``steps_per_call=K`` one compiled call runs K steps and the
    engine still fires the iteration events once per step; :meth:`terminate` then takes effect at the
    end of the K-step group, so the engine's counters and the train state never disagree.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import TrainState, create_trainer
        >>> state = TrainState.create(lambda p, x: x * p, jnp.array(0.0), optax.sgd(0.1))
        >>> trainer = create_trainer(state, lambda model, b: jnp.mean((model(b) - 1.0) ** 2))
        >>> type(trainer).__name__, type(trainer.state).__name__
        ('TrainingEngine', 'TrainingState')
    """

    state: TrainingState

    def __init__(
        self,
        process_fn: Callable[[Any, Any], Any],
        placement: Placement,
        prefetch: int | None,
        steps_per_call: int,
    ) -> None:
        super().__init__(process_fn)
        self.state = TrainingState()
        self.placement = placement
        self._prefetch = prefetch
        self._k = steps_per_call
        self._group_end = True
        self._pending_terminate: bool | None = None
        self.can_fuse = True  # the factories turn it off where updates cannot be folded (pmap, debug)
        self._factory: Callable[[Any], Any] | None = None  # builds the train state from a batch (lazy trainers)
        self.pads_batches = False  # evaluators: pad batches that do not split over the devices, and mask them
        self._padded: PaddedBatches | None = None
        self._fusion = FusedMetrics()  # the metric updates folded into the compiled step
        if steps_per_call > 1:
            self.add_event_handler(Events.ITERATION_COMPLETED, self._terminate_at_group_end)

    def _wrap_data(self, data: Iterable[Any]) -> Iterable[Any]:
        """The data as the step takes it: with ``prefetch=None`` the first batch of a pass sets how far ahead."""
        chosen = [self._prefetch or 0]  # batches in flight; with prefetch=None, decided from the first batch

        def decide(first: Any) -> int:
            chosen[0] = auto_prefetch(first, self.placement)
            return chosen[0]

        def place(batch: Any, stacked: bool = False) -> Any:
            put = self.placement.put_batch if chosen[0] else self.placement.prepare_batch
            return put(batch, stacked=stacked)

        auto = decide if self._prefetch is None else None
        self._padded = None
        if self.pads_batches and self.placement.n_devices > 1:
            data = self._padded = PaddedBatches(data, self.placement.n_devices)
        if self._k > 1:
            return StepGroups(data, self._k, lambda b: place(b, stacked=True), chosen[0], auto)
        return DevicePrefetch(data, place, size=chosen[0], decide=auto)

    def fuse_step_update(
        self,
        update: Any,
        reset: Any = None,
        compute: Any = None,
        *,
        per_step: bool = False,
        names: Sequence[str] = (),
    ) -> Callable[[], None] | None:
        """Fold a metric's update into the compiled step (see :meth:`Engine.fuse_step_update`).

        Accepted unless the placement is ``Pmap`` or ``debug=True``. With K steps per call one call updates
        K batches at once, so only metrics that reset at run or epoch boundaries are folded in, and that
        compute there too or publish a value for every step (``per_step``; iteration i then reads step
        i's own value). ``names``: where such a metric puts its value in ``state.metrics``; on GPU the
        step writes the next value into the last one's buffer when nothing else holds it.

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from ember.metrics import Average
            >>> from ember.training import TrainState, create_trainer
            >>> state = TrainState.create(lambda p, x: x * p, jnp.array(0.0), optax.sgd(0.1))
            >>> trainer = create_trainer(state, lambda m, b: jnp.mean((m(b) - 1.0) ** 2))
            >>> _ = Average(key="loss").attach(trainer, "loss")
            >>> len(trainer._fusion.metrics)
            1
            >>> round(trainer.run([jnp.ones(2)] * 3).metrics["loss"], 4)  # (1 + 0.64 + 0.4096) / 3
            0.6832
        """
        coarse = {Events.STARTED, Events.EPOCH_STARTED, Events.EPOCH_COMPLETED, Events.COMPLETED}
        grouped_ok = reset in coarse and (compute in coarse or (per_step and compute is Events.ITERATION_COMPLETED))
        if not self.can_fuse or (self._k > 1 and not grouped_ok):
            return None
        return self._fusion.add(update, names)

    def tree_state_dict(self) -> dict[str, Any]:
        """The arrays a checkpoint saves for this engine: its train state as ``{path: array}`` (on device).

        Paths are JAX key paths joined by dots (``params.Dense_0.kernel``), so any train state (linen
        dicts, NNX ``State`` objects, optax states) saves the same way; PRNG keys are saved as their raw
        ``key_data``.

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from ember.training import TrainState, create_trainer
            >>> state = TrainState.create(lambda p, x: x * p, jnp.array(2.0), optax.sgd(0.1))
            >>> sorted(create_trainer(state, lambda m, b: m(b)).tree_state_dict())
            ['params', 'rng', 'step']
        """
        if self.state.train_state is None:
            raise RuntimeError(_NOT_BUILT)
        return flatten_tree(self.state.train_state)

    def build_state(self, batch: Any) -> None:
        """Build the train state now from a sample ``batch``, as the first batch would (lazy trainers only).

        A trainer made from a model and an optimizer builds its state from the first batch it sees;
        resuming from a checkpoint before the first run needs the state first, to restore into.
        A state that exists already is left as it is.

        Examples:
            >>> import numpy as np, optax
            >>> from flax import linen as nn
            >>> from ember.training import create_supervised_trainer
            >>> trainer = create_supervised_trainer(nn.Dense(1), optax.sgd(0.1), lambda p, y: ((p - y) ** 2).mean())
            >>> trainer.build_state((np.ones((4, 2), np.float32), np.zeros((4, 1), np.float32)))
            >>> sorted(trainer.tree_state_dict())[:2]
            ['params.bias', 'params.kernel']
        """
        if self.state.train_state is not None:
            return
        if self._factory is None:
            raise RuntimeError("This engine has no state factory; give create_trainer a TrainState or a function.")
        self.state.train_state = self.placement.put_state(_build_state(self._factory, batch))

    def load_tree_state_dict(self, tree: dict[str, Any]) -> None:
        """Take a restored ``{path: array}`` train state and place it, in the live structure, on device.

        Examples:
            >>> import jax, jax.numpy as jnp, optax
            >>> from ember.training import TrainState, create_trainer
            >>> state = TrainState.create(lambda p, x: x * p, jnp.array(2.0), optax.sgd(0.1))
            >>> trainer = create_trainer(state, lambda m, b: m(b))
            >>> saved = trainer.tree_state_dict()
            >>> trainer.load_tree_state_dict({**saved, "params": jnp.array(5.0)})
            >>> float(trainer.state.train_state.params)
            5.0
        """
        if self.state.train_state is None:
            raise RuntimeError(_NOT_BUILT)
        self.state.train_state = self.placement.put_state(unflatten_like(self.state.train_state, tree))

    def terminate(self, skip_completed: bool = False) -> None:
        """As :meth:`Engine.terminate`; with K steps per call, at the end of the current group.

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from ember import Events
            >>> from ember.training import TrainState, create_trainer
            >>> state = TrainState.create(lambda p, x: x * p, jnp.array(0.0), optax.sgd(0.1))
            >>> trainer = create_trainer(state, lambda m, b: jnp.mean(m(b) ** 2), steps_per_call=4)
            >>> _ = trainer.add_event_handler(Events.ITERATION_COMPLETED(once=2), lambda e: e.terminate())
            >>> trainer.run([jnp.ones(2)] * 10).iteration
            4
        """
        if self._group_end:
            super().terminate(skip_completed)
        else:
            self._pending_terminate = skip_completed

    def _terminate_at_group_end(self) -> None:
        if self._pending_terminate is not None and self._group_end:
            super().terminate(self._pending_terminate)
            self._pending_terminate = None


_NOT_BUILT = (
    "This trainer has no train state yet: it builds it from the first batch. To resume before the first run, "
    "build it from a sample first: trainer.build_state(next(iter(data))), then Checkpoint.resume() or load_objects()."
)


#: A call's batch must hold at least this many host bytes for ``prefetch=None`` to put batches on device
#: ahead (on an accelerator). Below it ``jax.device_put`` from Python costs more than it hides: on an H100
#: prefetching 2 batches ran batches of 0.1, 0.8 and 1.0 MB at 0.53, 0.75 and 0.71 x the speed of handing
#: NumPy batches to the compiled call, and batches of 2.0, 3.2 and 12.6 MB at 1.49, 2.08 and 2.65 x
#: (docs/benchmarks.md).
PREFETCH_MIN_BYTES = 3 << 19  # 1.5 MiB


def auto_prefetch(batch: Any, placement: Placement) -> int:
    """How many batches ``prefetch=None`` keeps in flight, judged by the first (host) batch of a pass.

    Examples:
        >>> import numpy as np
        >>> from ember.training import SingleDevice
        >>> from ember.training._trainer import auto_prefetch
        >>> auto_prefetch(np.zeros((8, 4)), SingleDevice())  # small, and a CPU backend here: no prefetch
        0
    """
    if not placement.prefers_prefetch:
        return 0
    host_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(batch) if not isinstance(x, jax.Array))
    return 2 if host_bytes >= PREFETCH_MIN_BYTES else 0


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


def _platform(train_state: Any) -> str:
    """The platform (``"cpu"``, ``"gpu"``, ``"tpu"``) the train state lives on."""
    leaves = jax.tree.leaves(train_state)
    return next(iter(leaves[0].devices())).platform if leaves and isinstance(leaves[0], jax.Array) else "cpu"


def _scan_k(step: Callable[..., Any], *, unroll: bool) -> Callable[..., Any]:
    """K steps in one call; outputs come back stacked, and each step's view slices only what is read.

    ``unroll`` (the CPU backend): XLA:CPU runs convolutions inside a loop about 10x slower than outside
    one; the digits CNN of ``ember train`` took 1.33 s an epoch with 10 steps per call in a loop, 0.12 s
    with one step per call, and as little unrolled (at about 5 s more compilation). Accelerators keep the
    loop, which compiles once whatever K is.
    """

    def multi(state: Any, group: Any) -> Any:
        return lax.scan(step, state, group, unroll=unroll)

    return multi


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
        placement: :class:`SingleDevice`, :class:`DataParallel` or :class:`Pmap`; by default data
            parallel when several devices are visible.
        steps_per_call: run K steps per compiled call (``lax.scan`` over K stacked batches; unrolled on the
            CPU backend, where XLA:CPU runs convolutions inside a loop about 10x slower, so compilation
            takes about K times longer there).
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
    compiled: dict[tuple[int, int], Callable[..., Any]] = {}  # by (group size, fused-metrics version)
    spec: list[BatchSpec] = []

    def compile_for(engine: TrainingEngine, size: int, train_state: Any, batch: Any) -> Callable[..., Any]:
        key = (size, engine._fusion.version)
        if key in compiled:
            return compiled[key]
        grouped = steps_per_call > 1
        fused = bool(engine._fusion.metrics)
        one = engine._fusion.wrap(step, stacked=grouped, platform=_platform(train_state)) if fused else step
        fn = _scan_k(one, unroll=_platform(train_state) == "cpu") if grouped else one
        if grouped and fused:
            fn = engine._fusion.split_published(fn, size)
        if not debug:
            example = _example_output(step, placement, train_state, batch, stacked=grouped)
            fn = placement.compile_train(fn, example, stacked=grouped)
        compiled[key] = fn
        return fn

    def call(engine: TrainingEngine, fn: Callable[..., Any], batch: Any) -> Any:
        st = engine.state
        if engine._fusion.metrics:
            st.train_state, out = engine._fusion.call(fn, st.train_state, batch, held=st.metrics)
        else:
            st.train_state, out = fn(st.train_state, batch)
        return out

    def process(engine: TrainingEngine, batch: Any) -> Any:
        st = engine.state
        if st.train_state is None:
            engine.build_state(batch)
        if steps_per_call == 1:
            if spec:
                spec[0].check(batch)
            else:
                spec.append(BatchSpec(batch, allow_short=True))  # a short last batch: one more compilation
            return call(engine, compile_for(engine, 1, st.train_state, batch), batch)
        feeder: StepGroups = st.dataloader  # type: ignore[assignment]
        if feeder.slot == 0:  # one check per group, on the stacked host batches
            if spec:
                spec[0].check(feeder.host_group)
            else:
                spec.append(BatchSpec(feeder.host_group, stacked=True))
            fn = compile_for(engine, feeder.size, st.train_state, feeder.group)
            engine._outputs = call(engine, fn, feeder.group)  # type: ignore[attr-defined]
        engine._group_end = feeder.slot == feeder.size - 1
        engine._fusion.at_step(feeder.slot)
        return StepOutput(engine._outputs, feeder.slot)  # type: ignore[attr-defined]

    if not callable(state) and not isinstance(state, TrainState):
        raise TypeError(f"`state` must be a TrainState or a function of the first batch, got {type(state).__name__}.")
    engine = TrainingEngine(process, placement, prefetch, steps_per_call)
    engine.can_fuse = not debug and not isinstance(placement, Pmap)
    if isinstance(state, TrainState):
        engine.state.train_state = placement.put_state(state)
    else:
        engine._factory = state
    return engine


def _build_state(factory: Any, batch: Any) -> TrainState:
    built = factory(jax.device_get(batch)) if not isinstance(factory, TrainState) else factory
    if not isinstance(built, TrainState):
        raise TypeError(f"The state factory must return a TrainState, got {type(built).__name__}.")
    return built


def _example_output(
    step: Callable[..., Any], placement: Placement, train_state: Any, batch: Any, *, stacked: bool
) -> Any:
    """The per-device output structure of one step; only ``Pmap`` needs it, to choose its out_axes."""
    if not isinstance(placement, Pmap):
        return None
    one = jax.tree.map(lambda x: x[:, 0] if stacked else x, batch)  # (n, B/n, ...): one step's per-device batch
    shapes = jax.eval_shape(jax.vmap(step, in_axes=(None, 0), axis_name=placement.axis_name), train_state, one)[1]
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), shapes)


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
    step = make_eval_step(eval_fn)
    n = placement.n_devices

    def masked_step(state: Any, padded: Any) -> Any:  # a padded batch: (batch, mask of the real examples)
        return with_mask(step(state, padded[0]), padded[1], n)

    compiled: dict[tuple[int, bool], Callable[..., Any]] = {}  # by fused-metrics version, padded or not
    spec: list[BatchSpec] = []

    def compile_for(engine: TrainingEngine, padded: bool) -> Callable[..., Any]:
        fusion = engine._fusion
        fn = compiled.get((fusion.version, padded))
        if fn is None:
            one = masked_step if padded else step
            fn = fusion.wrap(lambda state, batch: (state, one(state, batch))) if fusion.metrics else one
            fn = compiled[fusion.version, padded] = fn if debug else placement.compile_eval(fn)
        return fn

    def process(engine: TrainingEngine, batch: Any) -> Any:
        padded = engine._padded is not None and engine._padded.padded.popleft()
        examples = batch[0] if padded else batch
        if spec:
            spec[0].check(examples)
        else:
            spec.append(BatchSpec(examples, allow_short=True))
        train_state = engine.state.train_state if isinstance(source, TrainState) else source.state.train_state  # type: ignore[attr-defined]
        fn = compile_for(engine, padded)
        out = fn(train_state, batch) if not engine._fusion.metrics else engine._fusion.call(fn, train_state, batch)[1]
        return merge_device_axis(out) if isinstance(placement, Pmap) else out

    engine = TrainingEngine(process, placement, prefetch, 1)
    engine.can_fuse = not debug and not isinstance(placement, Pmap)
    engine.pads_batches = True
    if isinstance(source, TrainState):
        engine.state.train_state = placement.put_state(source)
    return engine
