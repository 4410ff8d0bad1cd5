import jax
import jax.numpy as jnp
import numpy as np

from ember.training._packing import StatePacking


def test_packing_round_trips_every_value_bit_for_bit():
    """Mixed dtypes (float32, int32, bool, float16, a matrix) come back exactly, in one vector per width."""
    states = (
        {"sum": jnp.array(np.float32(1 / 3)), "count": jnp.array(2**31 - 1, jnp.int32)},
        (jnp.array([True, False, True]), jnp.array([1.5, -0.0, np.inf], jnp.float16)),
        jnp.arange(6, dtype=jnp.float32).reshape(2, 3) / 7,
        jnp.array(np.nan, jnp.float32),
    )
    packing = StatePacking(states)
    packed = packing.pack(states)
    assert [(p.dtype.name, p.shape) for p in packed] == [("uint32", (9,)), ("uint8", (3,)), ("uint16", (3,))]
    for original, back in zip(jax.tree.leaves(states), jax.tree.leaves(packing.unpack(packed)), strict=True):
        assert back.dtype == original.dtype
        assert back.shape == original.shape
        np.testing.assert_array_equal(np.atleast_1d(back).view(np.uint8), np.atleast_1d(original).view(np.uint8))
    assert jax.tree.structure(packing.unpack_one(packed, 1)) == jax.tree.structure(states[1])
    jitted = jax.jit(lambda p: packing._pack(packing.unpack(p)))  # what the step does: unpack, then pack
    assert all(bool(jnp.all(a == b)) for a, b in zip(jitted(packed), packed, strict=True))
