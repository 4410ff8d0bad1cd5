"""`TrainingEngine`: an engine that runs a compiled step on a train state, with its data put on device."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax

from ember._flat_tree import flatten_tree, unflatten_like
from ember.data import DevicePrefetch
from ember.engine import Engine, Events
from ember.training._auto_prefetch import auto_prefetch
from ember.training._devices.padding import PaddedBatches
from ember.training._devices.placement import Placement
from ember.training._devices.plan import MemoryPlan, engine_max_batch, engine_plan
from ember.training._feed import StepGroups
from ember.training._fused import FusedMetrics
from ember.training._training_state import NOT_BUILT, TrainingState, build_state


class TrainingEngine(Engine):
    """An [`Engine`][ember.engine.Engine] whose data is put on device ahead of the step that needs it.

    Built by [`create_trainer`][ember.training.create_trainer] and
    [`create_evaluator`][ember.training.create_evaluator]; ``engine.state.train_state`` holds the state the compiled
    step reads. With ``steps_per_call=K`` one compiled call runs K steps and the engine still fires the iteration events
    once per step; [`terminate`][ember.training.TrainingEngine.terminate] then takes effect at the end of the K-step
    group, so the engine's counters and the train state never disagree.

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
        *,
        debug: bool = False,
        fusion: FusedMetrics | None = None,
        factory: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__(process_fn)
        self.state = TrainingState()
        self.placement = placement
        self._prefetch = prefetch
        self._k = steps_per_call
        self._pending_terminate: tuple[bool, bool] | None = None  # terminate()'s (skip_completed, final)
        self._can_fuse = not debug and not placement.per_device  # where updates can be folded into the step
        self._factory = factory  # builds the train state from a batch (lazy trainers)
        self.pads_batches = False  # evaluators: pad batches that do not split over the devices, and mask them
        self._padded: PaddedBatches | None = None
        self._fusion = fusion or FusedMetrics()  # the metric updates folded into the step (its process's)
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
        if self.pads_batches:  # a batch that does not split over the devices, or a Masked one from the data
            data = self._padded = PaddedBatches(data, self.placement.n_devices)
        never_ahead = self._prefetch == 0 or (auto is not None and not self.placement.prefers_prefetch)
        if self._k == 1 and never_ahead and self.placement.takes_host_batches:
            return data  # nothing to put ahead nor to prepare (one CPU device): the compiled call takes host batches
        if self._k > 1:
            return StepGroups(data, self._k, lambda b: place(b, stacked=True), chosen[0], auto)
        return DevicePrefetch(data, place, size=chosen[0], decide=auto)

    def fuse_metric(self, metric: Any, *, reset: Any, compute: Any, per_step: bool) -> Callable[[], None] | None:
        """Run ``metric``'s update inside the compiled step; returns how to take it out, or ``None`` if refused.

        Metrics call this when they attach (the contract is in [`ember.metrics.Metric`][ember.metrics.Metric]). Refused
        under ``Pmap`` or ``debug=True``. With K steps per call one call updates K batches at once, so only metrics that
        reset at run or epoch boundaries are taken, and that compute there too or publish a value for every step
        (``per_step``; iteration i then reads step i's own value).

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from ember.metrics import Average
            >>> from ember.training import TrainState, create_trainer
            >>> state = TrainState.create(lambda p, x: x * p, jnp.array(0.0), optax.sgd(0.1))
            >>> trainer = create_trainer(state, lambda m, b: jnp.mean((m(b) - 1.0) ** 2))
            >>> _ = Average(key="loss").attach(trainer, "loss")  # calls trainer.fuse_metric
            >>> round(trainer.run([jnp.ones(2)] * 3).metrics["loss"], 4)  # (1 + 0.64 + 0.4096) / 3
            0.6832
        """
        coarse = {Events.STARTED, Events.EPOCH_STARTED, Events.EPOCH_COMPLETED, Events.COMPLETED}
        grouped_ok = reset in coarse and (compute in coarse or (per_step and compute is Events.ITERATION_COMPLETED))
        if not self._can_fuse or (self._k > 1 and not grouped_ok):
            return None
        return self._fusion.add(metric)

    @property
    def fused_metrics(self) -> tuple[Any, ...]:
        """The attached metrics whose updates run inside the compiled step, in the order they were fused.

        A metric that is not listed (refused by [`fuse_metric`][ember.training.TrainingEngine.fuse_metric], or not
        [`fusable`][ember.metrics.Metric.fusable]) is updated by an ITERATION_COMPLETED handler instead.

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from ember.metrics import Average
            >>> from ember.training import TrainState, create_trainer
            >>> state = TrainState.create(lambda p, x: x * p, jnp.array(0.0), optax.sgd(0.1))
            >>> trainer = create_trainer(state, lambda m, b: jnp.mean(m(b) ** 2))
            >>> _ = Average(key="loss").attach(trainer, "loss")
            >>> [type(m).__name__ for m in trainer.fused_metrics]
            ['Average']
        """
        return tuple(self._fusion.metrics)

    @property
    def prefetch(self) -> int | None:
        """Batches put on device ahead of the step, as given to the engine's factory (``None``: judged per pass).

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from ember.training import TrainState, create_trainer
            >>> state = TrainState.create(lambda p, x: x * p, jnp.array(0.0), optax.sgd(0.1))
            >>> loss = lambda model, batch: model(batch)
            >>> create_trainer(state, loss).prefetch, create_trainer(state, loss, prefetch=2).prefetch
            (None, 2)
        """
        return self._prefetch

    @property
    def state_factory(self) -> Callable[[Any], Any] | None:
        """What builds the train state from a batch (a lazy trainer's), or ``None`` when the state was given.

        Examples:
            >>> import optax
            >>> from flax import linen as nn
            >>> from ember.training import create_supervised_trainer
            >>> trainer = create_supervised_trainer(nn.Dense(1), optax.sgd(0.1), lambda p, y: ((p - y) ** 2).mean())
            >>> callable(trainer.state_factory), trainer.state.train_state is None
            (True, True)
        """
        return self._factory

    @property
    def padding(self) -> PaddedBatches | None:
        """The last pass's batches as padded to split over the devices (an evaluator's), or ``None`` (a trainer's).

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from ember.training import TrainState, create_evaluator
            >>> state = TrainState.create(lambda p, x: x * p, jnp.array(2.0), optax.sgd(0.1))
            >>> evaluator = create_evaluator(state, lambda model, batch: model(batch))
            >>> _ = evaluator.run([jnp.ones(3)])
            >>> type(evaluator.padding).__name__  # the pass the evaluator ran (a trainer's is None)
            'PaddedBatches'
        """
        return self._padded

    def precompile(self, batch: Any, *, background: bool = False) -> Future[bool]:
        """Compile this evaluator's step for batches like ``batch`` now, so its next run's first call does not wait.

        What the compilation needs (the shapes and placements of the train state, the fused metrics' states and the
        batch as the run will place it) is taken at the call; the compilation itself runs then, or with
        ``background=True`` on a thread of its own while the caller goes on (the trainer's first epoch, say: XLA
        compiles the two programs on two cores). Do not run this engine before the future is done
        ([`Evaluate`][ember.handlers.Evaluate] starts it when the trainer starts and waits for it before evaluating).
        The future's result is ``False`` where the run will compile for itself instead: a trainer, a per-device
        placement (``Pmap``), a batch the run pads to split over the devices, a placement that wraps its compiled
        call, ``debug=True``.

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from ember.training import TrainState, create_evaluator
            >>> state = TrainState.create(lambda p, x: x * p, jnp.array(2.0), optax.sgd(0.1))
            >>> evaluator = create_evaluator(state, lambda model, batch: model(batch))
            >>> evaluator.precompile(jnp.ones(4), background=True).result()
            True
        """
        prepare = getattr(self.process_function, "precompile", None)
        compile_now = prepare(self, batch) if prepare is not None else None
        done: Future[bool] = Future()
        if compile_now is None:
            done.set_result(False)
            return done
        if not background:
            done.set_result(compile_now())
            return done
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ember-precompile")
        future = pool.submit(compile_now)
        pool.shutdown(wait=False)  # its thread ends with its one task
        return future

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
            raise RuntimeError(NOT_BUILT)
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
        self.state.train_state = self.placement.put_state(build_state(self._factory, batch))

    def step_cost(self, batch: Any) -> dict[str, float]:
        """XLA's cost analysis of one step on the current train state and ``batch``: ``flops``, ``bytes accessed``.

        The step is lowered and compiled once more to read it (call it once, not per step); with a sharded or
        data-parallel placement the numbers are per device, as the compiled program runs on each. Not under
        ``Pmap``, whose state carries a device axis.

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from ember.training import TrainState, create_trainer
            >>> state = TrainState.create(lambda p, x: x @ p, jnp.zeros((256, 512)), optax.sgd(0.1))
            >>> trainer = create_trainer(state, lambda model, x: jnp.mean(model(x) ** 2))
            >>> flops = trainer.step_cost(jnp.ones((64, 256)))["flops"]
            >>> round(flops / (4 * 64 * 256 * 512), 2)  # forward and weight gradient: two matmuls
            1.01
        """
        if self.state.train_state is None:
            raise RuntimeError(NOT_BUILT)
        if self.placement.per_device:
            raise ValueError(
                f"step_cost reads one jit-compiled step; under {type(self.placement).__name__} the state has a device "
                "axis."
            )
        process: Any = self.process_function  # a TrainProcess or an EvalProcess: its step, before compilation
        cost = jax.jit(process.step).lower(self.state.train_state, batch).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost  # one entry per program in older JAX
        return {name: float(value) for name, value in (cost or {}).items()}

    def plan(self, batch: Any, *, memory: int | None = None) -> MemoryPlan:
        """Compile this engine's step for ``batch`` ahead of time and say what it needs of each device's memory.

        Nothing runs and nothing is allocated: a lazy trainer's state is built abstractly (``jax.eval_shape``), the
        step is lowered for the placement's shardings and the precision policy, and XLA compiles it. With
        ``steps_per_call`` K the plan is of the K-step call. On an evaluator it plans the eval step.

        Args:
            batch: one global batch (arrays, or ``jax.ShapeDtypeStruct`` leaves: only shapes and dtypes count).
            memory: the bytes a device may use; by default what the device reports (GPU, TPU), none on CPU.

        Returns:
            A [`MemoryPlan`][ember.training.MemoryPlan]; ``print(plan)`` shows the table and whether it fits.

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from ember.training import TrainState, create_trainer
            >>> state = TrainState.create(lambda p, x: x @ p, jnp.zeros((256, 512)), optax.sgd(0.1))
            >>> trainer = create_trainer(state, lambda model, x: jnp.mean(model(x) ** 2))
            >>> plan = trainer.plan(jnp.ones((64, 256)), memory=2**30)
            >>> plan.state["params"], plan.fits, round(plan.flops / (4 * 64 * 256 * 512), 2)
            (524288, True, 1.01)
        """
        return engine_plan(self, batch, memory)

    def max_batch(
        self, batch: Any, *, memory: int | None = None, multiple_of: int | None = None, largest: int = 2**20
    ) -> int | None:
        """The largest global batch whose step fits each device's memory, found by compiling only (no trial runs).

        Batches like ``batch`` but for the leading axis are planned (see [`plan`][ember.training.TrainingEngine.plan]):
        doubling from ``multiple_of`` until one does not fit, then bisecting. Each size compiles once.

        Args:
            batch: a batch whose structure, trailing shapes and dtypes the searched batches share.
            memory: the bytes a device may use; needed where the backend reports no limit (CPU).
            multiple_of: the sizes tried are multiples of this (by default the placement's batch devices; with
                ``accumulate_steps``, pass their product).
            largest: the search stops here.

        Returns:
            The batch size, or ``None`` when not even ``multiple_of`` fits.

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from ember.training import TrainState, create_trainer
            >>> state = TrainState.create(lambda p, x: x @ p, jnp.zeros((256, 512)), optax.sgd(0.1))
            >>> trainer = create_trainer(state, lambda model, x: jnp.mean(model(x) ** 2))
            >>> trainer.max_batch(jnp.ones((8, 256)), memory=4 * 2**20, multiple_of=8)
            712
        """
        return engine_max_batch(self, batch, memory, multiple_of, largest)

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
            raise RuntimeError(NOT_BUILT)
        self.state.train_state = self.placement.put_state(unflatten_like(self.state.train_state, tree))

    def terminate(self, skip_completed: bool = False, *, final: bool = True) -> None:
        """As ``Engine.terminate``; with K steps per call, at the end of the current group.

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
        if self.at_group_end:
            super().terminate(skip_completed, final=final)
        else:
            self._pending_terminate = (skip_completed, final)

    @property
    def at_group_end(self) -> bool:
        """Whether this iteration is the last of its K-step group (always, with one step per call).

        With ``steps_per_call=K`` one compiled call runs K steps and the train state has advanced K steps when the
        group's first ITERATION_COMPLETED fires; the engine can stop (or a checkpoint can be exact) only here.

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from ember import Events
            >>> from ember.training import TrainState, create_trainer
            >>> state = TrainState.create(lambda p, x: x * p, jnp.array(0.0), optax.sgd(0.1))
            >>> trainer = create_trainer(state, lambda m, b: jnp.mean(m(b) ** 2), steps_per_call=2)
            >>> ends = []
            >>> _ = trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: ends.append(e.at_group_end))
            >>> _ = trainer.run([jnp.ones(2)] * 4)
            >>> ends
            [False, True, False, True]
        """
        feeder = self.state.dataloader
        return self._k == 1 or not isinstance(feeder, StepGroups) or feeder.slot == feeder.size - 1

    def _terminate_at_group_end(self) -> None:
        if self._pending_terminate is not None and self.at_group_end:
            skip_completed, final = self._pending_terminate
            super().terminate(skip_completed, final=final)
            self._pending_terminate = None
