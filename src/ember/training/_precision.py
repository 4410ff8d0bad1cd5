"""Precision policies by Lightning's names: where the loss function computes in bfloat16 and what stays float32."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

#: The policies ``create_trainer(precision=...)`` takes now; Lightning's names, which users know.
PRECISIONS = ("32-true", "bf16-mixed")
_PLANNED = ("bf16-true", "16-mixed")


def check_precision(precision: object) -> None:
    """Raise unless ``precision`` is a policy ember runs."""
    if precision in _PLANNED:
        raise ValueError(
            f"`precision`={precision!r} is not available yet (parameters stored in 16 bits, loss scaling); "
            f"ember runs {list(PRECISIONS)}."
        )
    if precision not in PRECISIONS:
        raise ValueError(f"`precision` must be one of {list(PRECISIONS)}, got {precision!r}.")


def compute_dtype(precision: str) -> Any:
    """The dtype the loss function computes in: ``None`` (as given) for ``"32-true"``."""
    check_precision(precision)
    return jnp.bfloat16 if precision == "bf16-mixed" else None


def cast_floating(tree: Any, dtype: Any) -> Any:
    """Every floating array of ``tree`` as ``dtype`` (integers, keys and the rest untouched); ``None``: as given.

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.training._precision import cast_floating
        >>> cast = cast_floating({"w": jnp.ones(2), "n": jnp.arange(2)}, jnp.bfloat16)
        >>> cast["w"].dtype, cast["n"].dtype
        (dtype(bfloat16), dtype('int32'))
    """
    if dtype is None:
        return tree

    def cast(x: Any) -> Any:
        if (
            hasattr(x, "dtype")
            and jnp.issubdtype(x.dtype, jnp.floating)
            and not jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
        ):
            return x.astype(dtype)
        return x

    return jax.tree.map(cast, tree)
