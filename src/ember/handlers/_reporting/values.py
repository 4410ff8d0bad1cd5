"""Picking the numbers a logging handler reports: metrics by name and outputs by key."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ember.engine import Engine


def check_names(argument: str, names: str | Sequence[str] | None) -> str | tuple[str, ...]:
    """Validate ``metric_names``-style arguments: ``"all"``, ``None`` (none) or a sequence of names."""
    if names is None:
        return ()
    if names == "all":
        return "all"
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(f'`{argument}` must be "all", None or a sequence of names, got {names!r}.')
    return tuple(names)


def pick(
    engine: Engine,
    metric_names: str | tuple[str, ...],
    output_keys: str | tuple[str, ...],
    tag: str | None = None,
    output_transform: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    """``{[tag/]name: value}`` from ``engine.state.metrics`` and ``engine.state.output`` (values untouched).

    ``output_transform(output)`` (Ignite's) names values of its own: a mapping of names to values, or one
    value, named ``"output"``. Values may be device arrays; nothing is converted here.
    """
    st = engine.state
    values: dict[str, Any] = {}
    names = list(st.metrics) if metric_names == "all" else metric_names
    missing = [n for n in names if n not in st.metrics]
    if missing:
        raise KeyError(f"Metrics {missing} are not in engine.state.metrics (it holds {sorted(st.metrics)}).")
    values.update((n, st.metrics[n]) for n in names)
    if output_keys:
        output = st.output
        if not isinstance(output, Mapping):
            raise TypeError(
                f"`output_keys` needs a mapping output (a dict from the step), got {type(output).__name__}."
            )
        keys = list(output) if output_keys == "all" else output_keys
        absent = [k for k in keys if k not in output]
        if absent:
            raise KeyError(
                f"Output keys {absent} are not in engine.state.output (it holds {sorted(output)}); "
                "norms and the learning rate need create_trainer(..., extras=(...))."
            )
        values.update((k, output[k]) for k in keys if getattr(output[k], "ndim", 0) == 0)
    if output_transform is not None and st.output is not None:
        named = output_transform(st.output)
        values.update(named.items() if isinstance(named, Mapping) else [("output", named)])
    return {f"{tag}/{k}" if tag else k: v for k, v in values.items()}


def check_transform(output_transform: object) -> Callable[[Any], Any] | None:
    """``output_transform`` if it is ``None`` or callable, else a ``TypeError`` naming it."""
    if output_transform is not None and not callable(output_transform):
        raise TypeError(f"`output_transform` must be callable as output_transform(output), got {output_transform!r}.")
    return output_transform  # type: ignore[return-value]  # callable or None, checked
