"""The engine never reads a device value on its own; only handlers whose filter fired may.

On a GPU or TPU, ``jax.transfer_guard_device_to_host("disallow")`` catches a read. On XLA:CPU the guard
is silent, because CPU arrays reach NumPy without a copy (jax issue #16602); so the same property is
also pinned with stand-ins for device values that raise on any conversion to a host value.
"""

import jax
import jax.numpy as jnp
import pytest

from ember import Engine, Events


class HostReadError(AssertionError):
    pass


class Untouchable:
    """A device value stand-in: any attempt to turn it into a host value raises."""

    def _read(self, *args, **kwargs):
        raise HostReadError("the engine read a value it was not asked for")

    __float__ = __int__ = __index__ = __bool__ = __array__ = __len__ = __iter__ = _read
    item = tolist = block_until_ready = copy_to_host_async = _read


@jax.jit
def _step(x):
    return jnp.sum(x * 2.0)


def test_a_run_over_device_arrays_passes_the_transfer_guard():
    """Outputs that are device arrays, with filtered handlers that do not fire, make no host transfer."""
    data = [jnp.full((4,), float(i)) for i in range(6)]
    _step(data[0]).block_until_ready()  # compile outside the guard
    engine = Engine(lambda engine, batch: _step(batch))
    fired = []
    engine.add_event_handler(Events.ITERATION_COMPLETED(every=100), lambda e: fired.append(float(e.state.output)))
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: fired.append("plain"))
    with jax.transfer_guard_device_to_host("disallow"):
        state = engine.run(data, max_epochs=2)
    assert state.iteration == 12
    assert fired == ["plain"] * 12
    assert float(state.output) == 40.0


def test_the_engine_never_converts_batches_or_outputs():
    """Every event fires, with filters evaluated, without the engine converting a batch or an output."""
    engine = Engine(lambda engine, batch: Untouchable())
    seen = []
    for event in Events:
        if event is not Events.EXCEPTION_RAISED:
            engine.add_event_handler(event(every=2), lambda e, event=event: seen.append(event.name))
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=[1, 5]), lambda e: seen.append(type(e.state.output)))
    state = engine.run([Untouchable() for _ in range(4)], max_epochs=3)
    assert state.iteration == 12
    assert seen.count("ITERATION_COMPLETED") == 6
    assert seen.count(Untouchable) == 2
    assert engine.state_dict() == {"epoch_length": 4, "iteration": 12, "max_epochs": 3}


def test_a_handler_that_fires_and_reads_is_the_only_reader():
    """The stand-in is live: a firing handler that reads the output raises, at the iteration it fired."""
    engine = Engine(lambda engine, batch: Untouchable())
    engine.add_event_handler(Events.ITERATION_COMPLETED(every=3), lambda e: float(e.state.output))
    with pytest.raises(HostReadError, match="the engine read a value"):
        engine.run(range(10))
    assert engine.state.iteration == 3
