"""`TrainState`: the pytree a compiled step reads and returns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax import struct

from ember.training._devices.partition import model_names
from ember.training._devices.placement import BuildsStateSharded
from ember.training._models import (
    ApplyFn,
    linen_apply_fn,
    linen_init,
    nnx_apply_fn,
    nnx_split,
    plain_apply_fn,
)
from ember.training._step.guard import StepGuard
from ember.training._step.loss_scale import DynamicLossScale

if TYPE_CHECKING:
    from flax import nnx


def _check_tx(tx: object) -> None:
    if not isinstance(tx, optax.GradientTransformation):
        raise TypeError(f"`tx` must be an optax.GradientTransformation such as optax.adam(1e-3), got {tx!r}.")


def _check_seed(seed: object) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"`seed` must be an int, got {type(seed).__name__} {seed!r}.")


class TrainState(struct.PyTreeNode):
    """Everything a training step reads and writes: step, params, optimizer state, model state, RNG key.

    A pytree, so it passes through ``jax.jit`` and ``jax.pmap`` and is donated to the step. The model's calling
    convention (``apply_fn``) and the optimizer (``tx``) are static fields. Build one with
    [`from_linen`][ember.training.TrainState.from_linen], [`from_nnx`][ember.training.TrainState.from_nnx] or
    [`create`][ember.training.TrainState.create].

    Attributes:
        step: optimizer updates applied so far (an int32 scalar array; a skipped update does not count).
        params: the trainable parameters.
        opt_state: the optimizer's state.
        model_state: non-trainable collections, such as batch-norm statistics (``{}`` if none).
        rng: the run's base key; each step draws from ``fold_in(rng, step)``.
        apply_fn: ``apply_fn(params, model_state, key, train, *args, **kwargs) -> (out, model_state)``.
        tx: the optax optimizer.
        graphdef: for a state built [`from_nnx`][ember.training.TrainState.from_nnx], the module's graph definition.
        partitioning: the partition names the model put on its parameters (``nn.with_logical_partitioning``,
            ``nnx.with_partitioning``), as ``((path, names), ...)``; a [`Sharded`][ember.training.Sharded] placement
            reads them.
        loss_scale: under ``precision="16-mixed"``, the [`DynamicLossScale`][ember.training.DynamicLossScale]
            (saved and restored with the rest); ``None`` otherwise.
        guard: with ``create_trainer(skip_nonfinite=True)`` (and under ``"16-mixed"``), the
            [`StepGuard`][ember.training.StepGuard] that decides whether an update is applied; ``None`` otherwise.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.training import TrainState
        >>> state = TrainState.create(lambda p, x: x @ p["w"], {"w": jnp.ones((2, 1))}, optax.sgd(0.5), seed=0)
        >>> state = state.apply_gradients({"w": jnp.ones((2, 1))})
        >>> int(state.step), state.params["w"].ravel().tolist()
        (1, [0.5, 0.5])
    """

    step: jax.Array
    params: Any
    opt_state: Any
    model_state: Any
    rng: jax.Array
    apply_fn: ApplyFn = struct.field(pytree_node=False)
    tx: optax.GradientTransformation = struct.field(pytree_node=False)
    graphdef: Any = struct.field(pytree_node=False, default=None)
    partitioning: tuple[tuple[str, tuple[Any, ...]], ...] = struct.field(pytree_node=False, default=())
    loss_scale: DynamicLossScale | None = None
    guard: StepGuard | None = None

    def apply_gradients(self, grads: Any, model_state: Any = None) -> TrainState:
        """One optimizer update: new params, optimizer state and step (and model state, if given).

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from ember.training import TrainState
            >>> state = TrainState.create(lambda p, x: p * x, jnp.array(2.0), optax.sgd(0.1), seed=0)
            >>> round(float(state.apply_gradients(jnp.array(1.0)).params), 6)
            1.9
        """
        updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
        return self.replace(
            step=self.step + 1,
            params=optax.apply_updates(self.params, updates),
            opt_state=opt_state,
            model_state=self.model_state if model_state is None else model_state,
        )

    def to_nnx(self) -> nnx.Module:
        """The NNX module with this state's params and model state merged back in.

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from flax import nnx
            >>> from ember.training import TrainState
            >>> state = TrainState.from_nnx(nnx.Linear(3, 2, rngs=nnx.Rngs(0)), optax.sgd(0.1))
            >>> type(state.to_nnx()).__name__
            'Linear'
        """
        if self.graphdef is None:
            raise ValueError("to_nnx() needs a state built with TrainState.from_nnx; this one was not.")
        from flax import nnx  # imported where used: flax.nnx takes half a second to import (IPython)

        return nnx.merge(self.graphdef, self.params, self.model_state)

    @classmethod
    def _build(
        cls,
        apply_fn: ApplyFn,
        params: Any,
        model_state: Any,
        tx: Any,
        rng: jax.Array,
        graphdef: Any = None,
        partitioning: tuple[tuple[str, tuple[Any, ...]], ...] = (),
    ) -> TrainState:
        _check_tx(tx)
        return cls(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=tx.init(params),
            model_state=model_state,
            rng=rng,
            apply_fn=apply_fn,
            tx=tx,
            graphdef=graphdef,
            partitioning=partitioning,
        )

    @classmethod
    def create(
        cls,
        apply_fn: Callable[..., Any],
        params: Any,
        tx: optax.GradientTransformation,
        *,
        seed: int = 0,
    ) -> TrainState:
        """A state for a plain function ``apply_fn(params, *args, **kwargs)`` and a params pytree.

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from ember.training import TrainState
            >>> state = TrainState.create(lambda p, x: x * p, jnp.array(3.0), optax.adam(1e-3))
            >>> out, _ = state.apply_fn(state.params, state.model_state, None, False, 2.0)
            >>> float(out)
            6.0
        """
        if not callable(apply_fn):
            raise TypeError(f"`apply_fn` must be callable as apply_fn(params, *inputs), got {apply_fn!r}.")
        _check_seed(seed)
        return cls._build(plain_apply_fn(apply_fn), params, {}, tx, jax.random.PRNGKey(seed))

    @classmethod
    def from_linen(
        cls,
        module: nn.Module,
        sample_input: Any,
        tx: optax.GradientTransformation,
        *,
        seed: int = 0,
        rngs: Sequence[str] = (),
        train_arg: str | None = "train",
        placement: Any = None,
    ) -> TrainState:
        """Initialise a Flax linen module; ``params`` apart, the other collections become ``model_state``.

        Partition annotations (``nn.with_logical_partitioning``) are recorded in `partitioning` and the arrays unboxed.
        With a [`Sharded`][ember.training.Sharded] ``placement`` the state is built already sharded (``jax.eval_shape``,
        then one ``jit`` with ``out_shardings``): it never exists whole on one device.

        Args:
            module: the linen module.
            sample_input: an input (or a tuple of inputs) with the shapes the model will see.
            tx: the optax optimizer.
            seed: seeds both initialisation and the per-step RNG.
            rngs: names of the RNG streams the model draws from when training, e.g. ``("dropout",)``.
            train_arg: the name of the module's boolean training flag; passed when ``__call__`` takes it.
            placement: a [`Sharded`][ember.training.Sharded] placement to build the state sharded on; others are ignored
                here (the trainer places the state).

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from flax import linen as nn
            >>> from ember.training import TrainState
            >>> class MLP(nn.Module):
            ...     @nn.compact
            ...     def __call__(self, x, train: bool = False):
            ...         x = nn.BatchNorm(use_running_average=not train)(nn.Dense(4)(x))
            ...         return nn.Dense(1)(nn.Dropout(0.1, deterministic=not train)(x))
            >>> state = TrainState.from_linen(MLP(), jnp.ones((2, 3)), optax.adam(1e-3), rngs=("dropout",))
            >>> sorted(state.params), sorted(state.model_state)
            (['BatchNorm_0', 'Dense_0', 'Dense_1'], ['batch_stats'])
        """
        if not isinstance(module, nn.Module):
            raise TypeError(f"`module` must be a flax.linen.Module, got {type(module).__name__}.")
        _check_seed(seed)
        if isinstance(rngs, str) or not all(isinstance(r, str) for r in rngs):
            raise TypeError(f"`rngs` must be a sequence of stream names such as ('dropout',), got {rngs!r}.")
        init_key, step_key = jax.random.split(jax.random.PRNGKey(seed))
        apply_fn = linen_apply_fn(module, tuple(rngs), train_arg)

        def init() -> tuple[Any, Any]:
            return linen_init(module, sample_input, init_key, rngs, train_arg)

        def build(params: Any, model_state: Any, names: Any) -> TrainState:
            return cls._build(apply_fn, nn.unbox(params), nn.unbox(model_state), tx, step_key, partitioning=names)

        if isinstance(placement, BuildsStateSharded):  # the names from the shapes alone, then a sharded build
            names = model_names(jax.eval_shape(init)[0])
            return placement.init_state(lambda: build(*init(), names))
        params, model_state = init()
        return build(params, model_state, model_names(params))

    @classmethod
    def from_nnx(
        cls,
        model: nnx.Module | Callable[[], nnx.Module],
        tx: optax.GradientTransformation,
        *,
        seed: int = 0,
        placement: Any = None,
    ) -> TrainState:
        """Split a Flax NNX module into graph definition, params and the rest; train it functionally.

        The module's RNG streams are reseeded every step from ``fold_in(rng, step)``, so dropout differs per step and a
        resumed run draws the same numbers. [`to_nnx`][ember.training.TrainState.to_nnx] merges a state back. Partition
        annotations (``nnx.with_partitioning``) are recorded in `partitioning`. With a
        [`Sharded`][ember.training.Sharded] ``placement`` and ``model`` given as a function that builds the module, the
        module is built already sharded, under the placement's mesh (``nnx.eval_shape``, then one ``jit``).

        Args:
            model: the module, or a function of no arguments that builds it.
            tx: the optax optimizer.
            seed: seeds the per-step RNG.
            placement: a [`Sharded`][ember.training.Sharded] placement to build the state sharded on.

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from flax import nnx
            >>> from ember.training import TrainState
            >>> state = TrainState.from_nnx(nnx.Linear(3, 2, rngs=nnx.Rngs(0)), optax.sgd(0.1))
            >>> sorted(state.params)
            ['bias', 'kernel']
        """
        from flax import nnx

        if not isinstance(model, nnx.Module) and (not callable(model) or isinstance(model, nn.Module)):
            raise TypeError(f"`model` must be an nnx.Module or a function building one, got {type(model).__name__}.")
        _check_seed(seed)
        key = jax.random.PRNGKey(seed)

        def build(module: Any, names: Any) -> TrainState:
            if not isinstance(module, nnx.Module):
                raise TypeError(f"`model()` must build a flax.nnx.Module, got {type(module).__name__}.")
            graphdef, params, model_state = nnx_split(module)
            return cls._build(nnx_apply_fn(graphdef), params, model_state, tx, key, graphdef, partitioning=names)

        if isinstance(placement, BuildsStateSharded) and not isinstance(model, nnx.Module):
            factory: Callable[[], nnx.Module] = model
            with placement.scope():  # the mesh, and the logical rules NNX resolves its names by as it creates them
                abstract = nnx.eval_shape(factory)
                names = model_names(nnx_split(abstract)[1])
                return placement.init_state(lambda: build(factory(), names))
        module = model if isinstance(model, nnx.Module) else model()
        return build(module, model_names(nnx_split(module)[1]))

    @classmethod
    def from_flax(
        cls,
        state: Any,
        *,
        seed: int = 0,
        rngs: Sequence[str] = ("dropout",),
        train_arg: str | None = "train",
    ) -> TrainState:
        """A state from a ``flax.training.train_state.TrainState``, keeping its step and optimizer state.

        ``apply_fn``, ``params``, ``tx``, ``opt_state`` and ``step`` carry over; a ``batch_stats`` field (the usual
        subclass for batch norm) becomes ``model_state``. An ``apply_fn`` that is a linen module's ``apply``
        (``model.apply``) trains as [`from_linen`][ember.training.TrainState.from_linen] would: the step passes
        ``train`` when the module takes it and draws the ``rngs`` streams from its key. Any other ``apply_fn`` is called
        as Flax calls it, ``apply_fn({"params": params}, *inputs)``. [`create_trainer`][ember.training.create_trainer]
        and [`create_evaluator`][ember.training.create_evaluator] convert a Flax state with this themselves.

        Args:
            state: the Flax ``TrainState`` (or a subclass of it).
            seed: seeds the per-step RNG (a Flax state carries none).
            rngs: the RNG streams a linen module draws from when training.
            train_arg: the name of a linen module's boolean training flag.

        Examples:
            >>> import jax.numpy as jnp, optax
            >>> from flax import linen as nn
            >>> from flax.training import train_state
            >>> from ember.training import TrainState
            >>> model = nn.Dense(2)
            >>> params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 3)))["params"]
            >>> flax_state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(0.1))
            >>> state = TrainState.from_flax(flax_state)
            >>> int(state.step), sorted(state.params), state.opt_state is flax_state.opt_state
            (0, ['bias', 'kernel'], True)
        """
        if not is_flax_train_state(state):
            raise TypeError(f"`state` must be a flax.training.train_state.TrainState, got {_qualified(state)}.")
        _check_seed(seed)
        module = getattr(state.apply_fn, "__self__", None)
        if isinstance(module, nn.Module):
            apply_fn = linen_apply_fn(module, tuple(rngs), train_arg)
        else:
            flax_apply = state.apply_fn
            apply_fn = plain_apply_fn(lambda params, *args, **kwargs: flax_apply({"params": params}, *args, **kwargs))
        batch_stats = getattr(state, "batch_stats", None)
        return cls(
            step=jnp.asarray(state.step, jnp.int32),
            params=nn.unbox(state.params),
            opt_state=state.opt_state,
            model_state={"batch_stats": batch_stats} if batch_stats is not None else {},
            rng=jax.random.PRNGKey(seed),
            apply_fn=apply_fn,
            tx=state.tx,
            partitioning=model_names(state.params),
        )


def is_flax_train_state(value: object) -> bool:
    """Whether ``value`` is a ``flax.training.train_state.TrainState`` (Flax's, not ember's)."""
    from flax.training import train_state

    return isinstance(value, train_state.TrainState)


def _qualified(value: object) -> str:
    """``module.Class`` of a value, so two classes of one name (two ``TrainState`` s) tell apart."""
    return f"{type(value).__module__}.{type(value).__qualname__}"


def as_train_state(value: object, argument: str, alternatives: str = "") -> TrainState:
    """``value`` as ember's ``TrainState``: itself, or a Flax ``TrainState`` converted; else a ``TypeError``."""
    if isinstance(value, TrainState):
        return value
    if is_flax_train_state(value):
        return TrainState.from_flax(value)
    raise TypeError(
        f"`{argument}` must be an ember.training.TrainState or a flax.training.train_state.TrainState"
        f"{alternatives}, got {_qualified(value)}."
    )
