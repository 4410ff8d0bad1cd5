"""Placement: how state and batches meet devices, and how a step is compiled for them.

Three policies share one small interface: [`SingleDevice`][ember.training.SingleDevice] (``jit``, state donated),
[`DataParallel`][ember.training.DataParallel] (``jit`` over a ``Mesh`` with ``NamedSharding``: state replicated, batch
sharded on its leading axis) and [`Pmap`][ember.training.Pmap] (``pmap`` with an axis name; the state stays an ordinary
replicated ``jax.Array``, so nothing indexes ``x[0]`` and no removed API is used).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P


def check_divisible(batch: Any, n: int, *, stacked: bool = False) -> None:
    """Raise unless every leaf's batch axis splits evenly over ``n`` devices."""
    axis = 1 if stacked else 0
    for x in jax.tree.leaves(batch):
        shape = np.shape(x)
        if len(shape) <= axis or shape[axis] % n:
            size = shape[axis] if len(shape) > axis else "no batch axis"
            raise ValueError(
                f"A batch of size {size} cannot be split over {n} devices; use a batch size divisible by {n} "
                f"(drop_remainder=True drops a short last batch), or fewer devices."
            )


def one_call_at_a_time(fn: Callable[..., Any], devices: Sequence[Any]) -> Callable[..., Any]:
    """``fn``, made to wait for its result when it runs over several devices of the CPU backend.

    XLA:CPU runs the collectives between (simulated) CPU devices as an in-process rendezvous of one
    thread per device, and two programs in flight at once can deadlock there: a hung all-reduce in about
    one run in ten of ``examples/data_parallel.py`` on a 2-core machine, none in 25 runs with each step
    awaited. So on that backend a multi-device step finishes before the next is dispatched. One device,
    or any accelerator, keeps JAX's asynchronous dispatch.
    """
    if len(devices) < 2 or any(d.platform != "cpu" for d in devices):
        return fn

    @functools.wraps(fn)
    def awaited(*args: Any) -> Any:
        return jax.block_until_ready(fn(*args))

    return awaited


def place(value: Any, sharding: Any) -> Any:
    """``value`` with ``sharding``: kept if it has it, else placed (across processes, from the full value)."""
    if isinstance(value, jax.Array) and value.committed and value.sharding.is_equivalent_to(sharding, value.ndim):
        return value  # (an uncommitted array is placed: a step compiles again when its inputs' commitment changes)
    if jax.process_count() == 1:
        return jax.device_put(value, sharding)
    host = np.asarray(jax.device_get(value))
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def local_batch_ways(mesh: Mesh, batch_ways: int) -> int:
    """How many ways this process's part of a batch splits: its devices' share of the batch's ``batch_ways``."""
    devices = list(mesh.devices.flat)
    local = sum(d.process_index == jax.process_index() for d in devices)
    return max(1, batch_ways * local // len(devices))


def global_batch(batch: Any, sharding: Any, local_ways: int, *, stacked: bool) -> Any:
    """Each process's part of the global batch (``ArrayDataset``'s default shard) made one global array."""
    check_divisible(batch, local_ways, stacked=stacked)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), batch)


@runtime_checkable
class Placement(Protocol):
    """What a placement provides: how the train state and batches meet devices, and the compiled step for them.

    Trainers call it; users pick one (``SingleDevice``, ``DataParallel``, ``Pmap``, ``Sharded``) and pass it as
    ``create_trainer(..., placement=...)``. A new placement subclasses this protocol and implements ``put_state``,
    ``batch_sharding``, ``compile_train`` and ``compile_eval``; ``put_batch`` and ``prepare_batch`` have defaults.
    It declares what the trainer needs to know about it, instead of the trainer testing for its class:

    - ``per_device``: the step runs once per device (``pmap``): batches, outputs and the state carry a leading
      device axis, so metric updates are not folded into the step, ``step_cost`` does not apply and ``debug`` is
      refused;
    - ``takes_host_batches``: the compiled call takes host batches as given (``prepare_batch`` returns them
      unchanged), so with nothing to put ahead a trainer hands the data straight to it.

    A placement that builds the train state already sharded (``Sharded``) also has ``init_state`` and ``scope``
    (see `BuildsStateSharded`).

    Examples:
        >>> import numpy as np
        >>> from ember.training import Placement, SingleDevice
        >>> placement: Placement = SingleDevice()
        >>> batch = placement.put_batch({"x": np.ones((4, 2), np.float32)})
        >>> batch["x"].shape, placement.axis_name
        ((4, 2), None)
    """

    #: the ``pmap`` axis name the step must reduce over, or ``None`` under ``jit``.
    axis_name: str | None = None
    n_devices: int = 1
    #: the step runs once per device, with a leading device axis on batches, outputs and the state (``pmap``).
    per_device: bool = False
    #: the compiled call takes host batches as given: ``prepare_batch`` returns them unchanged.
    takes_host_batches: bool = True

    def put_state(self, state: Any) -> Any:
        """Place the train state on the devices."""
        raise NotImplementedError

    def put_batch(self, batch: Any, *, stacked: bool = False) -> Any:
        """Place one batch (or, ``stacked``, K batches stacked on a leading axis) on the devices."""
        return jax.device_put(self.prepare_batch(batch, stacked=stacked), self.batch_sharding(stacked))

    def prepare_batch(self, batch: Any, *, stacked: bool = False) -> Any:
        """Check and reshape a host batch for the compiled step, without transferring it.

        The compiled call then transfers it itself, which on a CPU backend is cheaper than
        ``jax.device_put`` (see ``docs/benchmarks.md``).
        """
        return batch

    def batch_sharding(self, stacked: bool) -> Any:
        """Where a (prepared) batch lives."""
        raise NotImplementedError

    def state_shardings(self, state: Any) -> Any:
        """Where each array of the train state ``state`` (or its ``jax.eval_shape``) lives: a sharding per leaf."""
        raise NotImplementedError(f"{type(self).__name__} does not say where a train state's arrays live.")

    @property
    def prefers_prefetch(self) -> bool:
        """Whether putting batches on device ahead of time pays: on accelerators, not on a CPU backend."""
        return jax.devices()[0].platform != "cpu"

    def compile_train(
        self, step: Callable[..., Any], example_output: Any = None, *, stacked: bool = False
    ) -> Callable[..., Any]:
        """Compile ``step(state, batch) -> (state, output)`` with the state donated.

        ``example_output`` is one step's per-device output structure (only ``Pmap`` uses it); ``stacked``
        says the batch holds K steps on a leading axis.
        """
        raise NotImplementedError

    def compile_eval(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """Compile ``step(state, batch) -> output``."""
        raise NotImplementedError


@runtime_checkable
class BuildsStateSharded(Protocol):
    """A placement that builds the train state already sharded (``Sharded``): ``TrainState`` calls it to do so.

    ``init_state(make)`` builds ``make()``'s result with every array in its sharding, without the whole state ever
    on one device; ``scope()`` is the context (the mesh, the logical rules) a model resolves its names in.
    """

    def init_state(self, make: Callable[[], Any]) -> Any:
        """``make()``, built sharded."""
        ...

    def scope(self) -> AbstractContextManager[Any]:
        """The context a model's logical names resolve in."""
        ...


class SingleDevice(Placement):
    """Everything on one device; the step is ``jax.jit`` with the state donated.

    Examples:
        >>> from ember.training import SingleDevice
        >>> SingleDevice().n_devices
        1
    """

    def __init__(self, device: Any = None) -> None:
        self.device = device or jax.devices()[0]

    def put_state(self, state: Any) -> Any:
        return jax.device_put(state, self.device)

    def state_shardings(self, state: Any) -> Any:
        return jax.tree.map(lambda _: SingleDeviceSharding(self.device), state)

    def batch_sharding(self, stacked: bool) -> Any:
        return self.device

    def compile_train(
        self, step: Callable[..., Any], example_output: Any = None, *, stacked: bool = False
    ) -> Callable[..., Any]:
        return jax.jit(step, donate_argnums=0)

    def compile_eval(self, step: Callable[..., Any]) -> Callable[..., Any]:
        return jax.jit(step)

    def __repr__(self) -> str:
        return f"SingleDevice({self.device})"


class DataParallel(Placement):
    """Data parallel over a ``Mesh``: ``jax.jit`` with the state replicated and the batch sharded.

    Args:
        mesh: a one-axis mesh; by default all visible devices.
        axis: the mesh axis the batch is split on.

    Examples:
        >>> from ember.training import DataParallel
        >>> placement = DataParallel()
        >>> placement.n_devices == len(__import__("jax").devices())
        True
    """

    takes_host_batches = False

    def __init__(self, mesh: Mesh | None = None, axis: str = "data") -> None:
        self.mesh = mesh if mesh is not None else Mesh(np.array(jax.devices()), (axis,))
        if axis not in self.mesh.axis_names:
            raise ValueError(f"`axis`={axis!r} is not an axis of the mesh, whose axes are {self.mesh.axis_names}.")
        self.axis = axis
        self.n_devices = int(self.mesh.shape[axis])
        self.replicated = NamedSharding(self.mesh, P())
        self._batch = NamedSharding(self.mesh, P(axis))
        self._stacked = NamedSharding(self.mesh, P(None, axis))
        self._local_ways = local_batch_ways(self.mesh, self.n_devices)  # (the processes do not change)

    def state_shardings(self, state: Any) -> Any:
        return jax.tree.map(lambda _: self.replicated, state)

    def put_state(self, state: Any) -> Any:
        if jax.process_count() > 1:  # every process holds the same values: they become one global array
            state = jax.device_get(state)
        return jax.device_put(state, self.replicated)

    def prepare_batch(self, batch: Any, *, stacked: bool = False) -> Any:
        if jax.process_count() == 1:
            check_divisible(batch, self.n_devices, stacked=stacked)
            return batch
        return global_batch(batch, self.batch_sharding(stacked), self._local_ways, stacked=stacked)

    def put_batch(self, batch: Any, *, stacked: bool = False) -> Any:
        prepared = self.prepare_batch(batch, stacked=stacked)
        return prepared if jax.process_count() > 1 else jax.device_put(prepared, self.batch_sharding(stacked))

    def batch_sharding(self, stacked: bool) -> Any:
        return self._stacked if stacked else self._batch

    def compile_train(
        self, step: Callable[..., Any], example_output: Any = None, *, stacked: bool = False
    ) -> Callable[..., Any]:
        replicated = self.replicated

        def pinned(state: Any, batch: Any) -> Any:
            new_state, out = step(state, batch)
            return jax.lax.with_sharding_constraint(new_state, replicated), out

        compiled = jax.jit(pinned, donate_argnums=0, in_shardings=(replicated, self.batch_sharding(stacked)))
        return one_call_at_a_time(compiled, list(self.mesh.devices.flat))

    def compile_eval(self, step: Callable[..., Any]) -> Callable[..., Any]:
        return one_call_at_a_time(
            jax.jit(step, in_shardings=(self.replicated, self._batch)), list(self.mesh.devices.flat)
        )

    def __repr__(self) -> str:
        return f"DataParallel({self.n_devices} devices, axis={self.axis!r})"


class Pmap(Placement):
    """``jax.pmap`` over the devices with an axis name; gradients, loss and model state are averaged.

    The state goes in and out unmapped (``in_axes=None``, ``out_axes=None``), so it stays one replicated
    ``jax.Array`` per leaf. Scalar float outputs (the loss, averaged) come out unmapped too; other outputs
    keep a leading device axis.

    Args:
        devices: the devices, by default all visible ones.
        axis_name: the name collectives reduce over.

    Examples:
        >>> from ember.training import Pmap
        >>> Pmap().axis_name
        'batch'
    """

    per_device = True
    takes_host_batches = False

    def __init__(self, devices: Sequence[Any] | None = None, axis_name: str = "batch") -> None:
        self.devices = list(devices) if devices is not None else jax.devices()
        self.axis_name = axis_name
        self.n_devices = len(self.devices)
        mesh = Mesh(np.array(self.devices), (axis_name,))
        self.replicated = NamedSharding(mesh, P())
        self._mapped = NamedSharding(mesh, P(axis_name))

    def put_state(self, state: Any) -> Any:
        return jax.device_put(state, self.replicated)

    def state_shardings(self, state: Any) -> Any:
        return jax.tree.map(lambda _: self.replicated, state)

    def prepare_batch(self, batch: Any, *, stacked: bool = False) -> Any:
        check_divisible(batch, self.n_devices, stacked=stacked)
        n = self.n_devices

        def split(x: Any) -> Any:  # a host-side reshape: (B, ...) -> (n, B/n, ...), or (K, B, ...) -> (n, K, B/n, ...)
            if stacked:
                return x.reshape((x.shape[0], n, x.shape[1] // n, *x.shape[2:])).swapaxes(0, 1)
            return x.reshape((n, x.shape[0] // n, *x.shape[1:]))

        return jax.tree.map(lambda x: split(x if isinstance(x, jax.Array) else np.asarray(x)), batch)

    def batch_sharding(self, stacked: bool) -> Any:
        return self._mapped

    def _out_axes(self, output: Any, stacked: bool) -> Any:
        """Where each output's device axis goes: none for scalar floats (averaged), else first or after K.

        With K steps stacked the device axis comes after the step axis, so one step's slice looks like a
        single step's output.
        """
        mapped = 1 if stacked else 0
        return jax.tree.map(lambda s: None if s.ndim == 0 and jnp.issubdtype(s.dtype, jnp.floating) else mapped, output)

    def compile_train(
        self, step: Callable[..., Any], example_output: Any = None, *, stacked: bool = False
    ) -> Callable[..., Any]:
        out_axes = (None, self._out_axes(example_output, stacked))
        compiled = jax.pmap(
            step, self.axis_name, in_axes=(None, 0), out_axes=out_axes, donate_argnums=0, devices=self.devices
        )
        return one_call_at_a_time(compiled, self.devices)

    def compile_eval(self, step: Callable[..., Any]) -> Callable[..., Any]:
        return one_call_at_a_time(jax.pmap(step, self.axis_name, in_axes=(None, 0), devices=self.devices), self.devices)

    def __repr__(self) -> str:
        return f"Pmap({self.n_devices} devices, axis_name={self.axis_name!r})"


def default_placement() -> Placement:
    """``DataParallel`` over all devices when more than one is visible, else ``SingleDevice``.

    Examples:
        >>> from ember.training import default_placement
        >>> type(default_placement()).__name__ in ("SingleDevice", "DataParallel")
        True
    """
    return DataParallel() if len(jax.devices()) > 1 else SingleDevice()
