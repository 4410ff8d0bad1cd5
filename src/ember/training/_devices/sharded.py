"""`Sharded`: the train state sharded over a named mesh (FSDP, tensor parallel), the batch over its data axes."""

from __future__ import annotations

import contextlib
import contextvars
import math
import warnings
from collections.abc import Callable, Generator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ember.training._devices.partition import Partitioner, Rules
from ember.training._devices.placement import (
    Placement,
    check_divisible,
    global_batch,
    local_batch_ways,
    one_call_at_a_time,
    place,
)

_TRACED_BUILD: contextvars.ContextVar[bool] = contextvars.ContextVar("ember_traced_build", default=False)


@contextlib.contextmanager
def traced_build(placement: Any) -> Generator[None]:
    """Within: a `Sharded` placement's ``init_state`` is traced by the caller (``jax.eval_shape`` of a factory).

    ``jax.set_mesh`` cannot be entered inside a trace, so the mesh is set here, outside it. Other placements: as is.
    """
    if not isinstance(placement, Sharded):
        yield
        return
    token = _TRACED_BUILD.set(True)
    try:
        with jax.set_mesh(placement.mesh):
            yield
    finally:
        _TRACED_BUILD.reset(token)


#: Mesh axes that split a model's tensors rather than the batch (tensor parallelism).
MODEL_AXES = ("model", "tensor")

#: A placement warns when its fullest device holds more than this many times total/N of the parameters.
SPREAD_WARNING = 2.0


class Sharded(Placement):
    """The train state sharded over a named ``Mesh``; each step is one ``jax.jit`` over it (XLA's SPMD).

    Each array of the train state gets a ``PartitionSpec``, from the first source that has one:

    1. the model's own metadata: Flax linen's ``nn.with_logical_partitioning`` (logical names, mapped to
       mesh axes by ``logical_rules``) or ``nn.with_partitioning``, and Flax NNX's
       ``nnx.with_partitioning`` (``out_sharding`` metadata);
    2. ``rules``: ``(regex, PartitionSpec)`` pairs matched against the array's dotted path
       (``params.Dense_0.kernel``), first match wins, as Keras 3's ``LayoutMap``;
    3. the automatic FSDP rule, with ``fsdp_axis``: a parameter of at least ``min_size`` elements is split along its
       largest dimension that the axis divides; smaller ones, and those no dimension of which it divides (listed in
       [`summary`][ember.training.Sharded.summary]), stay replicated.

    Optimizer moments follow their parameters, counts stay replicated; ``step`` and ``rng`` are replicated.
    The batch is split over ``batch_axes`` (by default every mesh axis but ``model``/``tensor``). Build
    the state sharded from the start with ``TrainState.from_linen(..., placement=placement)`` (or
    ``from_nnx``): the full state then never exists on one device.

    Args:
        mesh: the device mesh, with named axes (``("fsdp",)``, ``("data", "model")``, ...).
        rules: ``(regex, PartitionSpec)`` pairs for arrays the model does not annotate.
        logical_rules: ``(logical name, mesh axis or None)`` pairs for linen's logical names.
        fsdp_axis: the mesh axis of the automatic rule; ``None`` turns it off (unmatched arrays replicate).
        min_size: the automatic rule leaves parameters smaller than this replicated.
        batch_axes: the mesh axes the batch is split over.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> from ember.training import Sharded
        >>> placement = Sharded(Mesh(np.array(jax.devices()), ("fsdp",)), fsdp_axis="fsdp")
        >>> placement.batch_axes, placement.n_devices == len(jax.devices())
        (('fsdp',), True)
    """

    takes_host_batches = False

    def __init__(
        self,
        mesh: Mesh,
        *,
        rules: Rules = (),
        logical_rules: Sequence[tuple[str, Any]] = (),
        fsdp_axis: str | None = None,
        min_size: int = 2**14,
        batch_axes: Sequence[str] | None = None,
    ) -> None:
        if not isinstance(mesh, Mesh):
            raise TypeError(f"`mesh` must be a jax.sharding.Mesh, got {type(mesh).__name__}.")
        if fsdp_axis is not None and fsdp_axis not in mesh.axis_names:
            raise ValueError(f"`fsdp_axis`={fsdp_axis!r} is not an axis of the mesh, whose axes are {mesh.axis_names}.")
        if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
            raise ValueError(f"`min_size` must be a non-negative int, got {min_size!r}.")
        for pair in rules:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) and isinstance(pair[1], P)):
                raise TypeError(f"`rules` must hold (regex, PartitionSpec) pairs, got {pair!r}.")
        axes = tuple(batch_axes) if batch_axes is not None else tuple(a for a in mesh.axis_names if a not in MODEL_AXES)
        for axis in axes:
            if axis not in mesh.axis_names:
                raise ValueError(f"`batch_axes` names {axis!r}, but the mesh has only the axes {mesh.axis_names}.")
        self.mesh, self.batch_axes, self.min_size = mesh, axes, min_size
        self.partitioner = Partitioner(
            mesh, rules=rules, logical_rules=logical_rules, fsdp_axis=fsdp_axis, min_size=min_size
        )
        self.n_devices = math.prod(int(mesh.shape[a]) for a in axes)  # the batch splits this many ways
        self.replicated = NamedSharding(mesh, P())
        self._batch = NamedSharding(mesh, P(axes or None))
        self._stacked = NamedSharding(mesh, P(None, axes or None))
        self._devices = list(mesh.devices.flat)
        self._local_ways = local_batch_ways(mesh, self.n_devices)  # (the processes do not change)
        self._warned = False

    # -- the state -------------------------------------------------------------------------------

    def state_shardings(self, state: Any) -> Any:
        """A ``NamedSharding`` for every leaf of ``state`` (a ``TrainState``, or its ``jax.eval_shape``).

        Examples:
            >>> import jax, jax.numpy as jnp, numpy as np, optax
            >>> from jax.sharding import Mesh
            >>> from ember.training import Sharded, TrainState
            >>> placement = Sharded(Mesh(np.array(jax.devices()), ("fsdp",)), fsdp_axis="fsdp", min_size=1)
            >>> state = TrainState.create(lambda p, x: x @ p, jnp.zeros((8, 2)), optax.sgd(0.1))
            >>> placement.state_shardings(state).params.spec
            P('fsdp', None)
        """
        shardings = self.partitioner.shardings(state, dict(getattr(state, "partitioning", ()) or ()))
        ratio, n = self.partitioner.spread()
        if ratio > SPREAD_WARNING and not self._warned:
            self._warned = True
            warnings.warn(
                f"The fullest device holds {ratio:.1f} x total/{n} of the arrays meant to split over {n} devices "
                f"({self._replicated_note()}). Map the model's logical names to a mesh axis, add rules, or raise "
                "`min_size`; placement.layout(state) lists every array.",
                UserWarning,
                stacklevel=3,
            )
        return shardings

    def _replicated_note(self) -> str:
        large = [(shape, spec) for _, shape, spec, _ in self.partitioner.layout if math.prod(shape) >= self.min_size]
        whole = [1 for _, spec in large if self.partitioner.shards(spec) == 1]
        return f"{len(whole)} of {len(large)} arrays replicated, counting those of {self.min_size:,} elements or more"

    @contextlib.contextmanager
    def scope(self) -> Generator[None]:
        """The mesh, and the logical rules as Flax's context (linen and NNX), for code that builds a model on it.

        A Flax NNX module shards its variables as it creates them, by their logical names: built inside this scope,
        those names resolve through ``logical_rules``, as linen's do through the placement
        (``TrainState.from_nnx(..., placement=)`` builds inside it). A linen module is initialised under the mesh
        alone: with the rules in force, linen constrains some kernels before it reshapes them.

        Examples:
            >>> import jax, numpy as np
            >>> from flax import linen as nn
            >>> from jax.sharding import Mesh
            >>> from ember.training import Sharded
            >>> placement = Sharded(Mesh(np.array(jax.devices()), ("fsdp",)), logical_rules=[("embed", "fsdp")])
            >>> with placement.scope():
            ...     nn.get_logical_axis_rules()
            (('embed', 'fsdp'),)
        """
        from flax import linen as nn

        with jax.set_mesh(self.mesh), nn.logical_axis_rules(tuple(self.partitioner.logical.items())):
            yield

    def layout(self, state: Any) -> str:
        """A table of where every array of ``state`` goes: path, shape, spec, and bytes on each of its devices.

        ``ember train`` prints it at the start of a sharded run.

        Examples:
            >>> import jax, jax.numpy as jnp, numpy as np, optax
            >>> from jax.sharding import Mesh
            >>> from ember.training import Sharded, TrainState
            >>> placement = Sharded(Mesh(np.array(jax.devices()[:1]), ("fsdp",)), fsdp_axis="fsdp", min_size=1)
            >>> state = TrainState.create(lambda p, x: x @ p["w"], {"w": jnp.zeros((8, 2))}, optax.sgd(0.1))
            >>> print(placement.layout(state))
            array     shape   spec              bytes per device
            params.w  (8, 2)  P('fsdp', None)                 64
        """
        self.state_shardings(state)
        rows = [
            (path, str(shape), str(spec), f"{size // self.partitioner.shards(spec):,}")
            for path, shape, spec, size in self.partitioner.layout
        ]
        head = ("array", "shape", "spec", "bytes per device")
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
        lines = [
            "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in [head, *rows]
        ]
        return "\n".join(line.rstrip() for line in lines)

    def put_state(self, state: Any) -> Any:
        """Place ``state`` by ``state_shardings`` (arrays already placed so stay where they are)."""
        return jax.tree.map(place, state, self.state_shardings(state))

    def init_state(self, make: Callable[[], Any]) -> Any:
        """Build the train state ``make()`` already sharded: shapes by ``jax.eval_shape``, then one ``jit``.

        The full state never exists on one device or host; each device computes only its shards. Inside
        ``traced_build`` (a plan tracing a state's factory) it is ``make()``.
        """
        if _TRACED_BUILD.get():  # traced by the caller, with the mesh already set
            return make()
        with jax.set_mesh(self.mesh):  # linen resolves its names through the placement, after init
            abstract = jax.eval_shape(make)
            shardings = self.state_shardings(abstract)
            return jax.jit(make, out_shardings=shardings)()

    def summary(self) -> str:
        """The mesh, the batch axes, and what the automatic rule left replicated (after placing a state).

        Examples:
            >>> import jax, numpy as np
            >>> from jax.sharding import Mesh
            >>> from ember.training import Sharded
            >>> print(Sharded(Mesh(np.array(jax.devices()[:1]), ("fsdp",)), fsdp_axis="fsdp").summary())
            Sharded: mesh {'fsdp': 1}, batch over ('fsdp',)
        """
        head = f"Sharded: mesh {dict(self.mesh.shape)}, batch over {self.batch_axes}"
        notes = list(self.partitioner.notes.values())
        if self.partitioner.layout:
            ratio, n = self.partitioner.spread()
            if ratio > SPREAD_WARNING:
                notes.append(f"the fullest device holds {ratio:.1f} x total/{n} ({self._replicated_note()})")
        return "\n".join([head, *(f"  {note}" for note in notes)])

    # -- batches and steps -----------------------------------------------------------------------

    def prepare_batch(self, batch: Any, *, stacked: bool = False) -> Any:
        sharding = self.batch_sharding(stacked)
        if jax.process_count() == 1:
            check_divisible(batch, self.n_devices, stacked=stacked)
            return jax.device_put(batch, sharding)
        return global_batch(batch, sharding, self._local_ways, stacked=stacked)

    def put_batch(self, batch: Any, *, stacked: bool = False) -> Any:
        return self.prepare_batch(batch, stacked=stacked)

    def batch_sharding(self, stacked: bool) -> Any:
        return self._stacked if stacked else self._batch

    def compile_train(
        self, step: Callable[..., Any], example_output: Any = None, *, stacked: bool = False
    ) -> Callable[..., Any]:
        """``jit`` with the state donated; the new state keeps the shardings the first call's state has."""
        devices, compiled = self._devices, []

        def call(carry: Any, batch: Any) -> Any:
            if not compiled:
                shardings = jax.tree.map(lambda x: x.sharding, carry)

                def pinned(carry: Any, batch: Any) -> Any:
                    new, out = step(carry, batch)
                    return jax.lax.with_sharding_constraint(new, shardings), out

                compiled.append(one_call_at_a_time(jax.jit(pinned, donate_argnums=0), devices))
            return compiled[0](carry, batch)

        return call

    def compile_eval(self, step: Callable[..., Any]) -> Callable[..., Any]:
        return one_call_at_a_time(jax.jit(step), self._devices)

    def __repr__(self) -> str:
        return f"Sharded(mesh={dict(self.mesh.shape)}, batch_axes={self.batch_axes})"


def fsdp(
    devices: Sequence[Any] | None = None,
    *,
    min_size: int = 2**14,
    rules: Rules = (),
    logical_rules: Sequence[tuple[str, Any]] = (),
) -> Sharded:
    """Fully sharded data parallel over ``devices`` (all by default): a one-axis mesh ``("fsdp",)``.

    Every parameter of at least ``min_size`` elements (and its optimizer moments) is split over the
    devices along its largest divisible dimension; the batch is split over them too. A model that names its
    axes (linen's ``nn.with_logical_partitioning``, NNX's ``nnx.with_partitioning``) is placed by its names,
    mapped by ``logical_rules`` (``[("embed", "fsdp"), ("mlp", None)]``); ``rules`` place arrays by path.

    Examples:
        >>> from ember.training import fsdp
        >>> fsdp().batch_axes
        ('fsdp',)
    """
    mesh = Mesh(np.array(list(devices) if devices is not None else jax.devices()), ("fsdp",))
    return Sharded(mesh, rules=rules, logical_rules=logical_rules, fsdp_axis="fsdp", min_size=min_size)
