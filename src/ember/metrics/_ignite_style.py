"""A `Metric` written Ignite's way: ``reset``/``update``/``compute`` on the host, with Ignite's two decorators.

Ignite users write their own metric by subclassing ``Metric`` and overriding ``reset``, ``update`` and ``compute``,
keeping plain counters (``self._num_correct``), marking ``reset``/``update`` with ``reinit__is_reduced`` and
``compute`` with ``sync_all_reduce("_num_examples", "_num_correct:SUM")``. Such a metric runs in ember as written:
updated by a handler on the host (never inside a compiled step), its output passed through ``output_transform``
first as Ignite does, its counters summed over processes before ``compute`` and saved with a checkpoint of its
engine (the attributes its ``sync_all_reduce`` names, and those in Ignite's ``_state_dict_all_req_keys``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ember._multiprocess import gather_text

_OPS: dict[str, Callable[[list[Any]], Any]] = {
    "SUM": lambda xs: functools.reduce(lambda a, b: a + b, xs),
    "MAX": lambda xs: functools.reduce(np.maximum, xs),
    "MIN": lambda xs: functools.reduce(np.minimum, xs),
    "PRODUCT": lambda xs: functools.reduce(lambda a, b: a * b, xs),
}


def check_device(device: Any) -> None:
    """Ignite's ``device=``, accepted for its code: ``None``, a name (``"cpu"``, ``"cuda"``), a JAX device or sharding.

    ember's accumulators live where the step's outputs are (a device metric's) or on the host (one written Ignite's
    way), so the device is checked, not used.
    """
    import jax

    if device is None or isinstance(device, str | jax.Device | jax.sharding.Sharding):
        return
    if type(device).__name__ == "device" and type(device).__module__ == "torch":  # torch.device("cpu")
        return
    raise TypeError(
        f"`device` must be None, a device name such as 'cpu', a JAX device or a sharding, got {type(device).__name__}."
    )


def is_ignite_style(cls: type, base: type) -> bool:
    """Whether ``cls`` (a subclass of ``base``, `Metric`) defines Ignite's ``update``/``compute``, not ember's parts."""

    def own(name: str) -> bool:
        return getattr(cls, name) is not getattr(base, name)

    return not any(map(own, ("batch_state", "finalize", "empty"))) and (own("update") or own("compute"))


def ignite_update_argument(metric: Any, output: Any) -> Any:
    """What Ignite's ``update`` gets from an engine's output, as Ignite's ``Metric`` gives it.

    ``output_transform``'s result; a mapping as the tuple of its ``required_output_keys`` (``("y_pred", "y")``, which
    is ember's ``keys``).
    """
    out = metric._output_transform(output) if metric._output_transform is not None else output
    if not isinstance(out, Mapping):
        return out
    required = getattr(metric, "required_output_keys", metric.keys)
    if required is None:
        return out
    missing = [k for k in required if k not in out]
    if missing:
        raise ValueError(
            f"{type(metric).__name__} needs the keys {list(required)} in the output, but {missing} "
            f"{'is' if len(missing) == 1 else 'are'} missing; the output holds {sorted(out)}."
        )
    return tuple(out[k] for k in required)


def reinit__is_reduced(method: Callable[..., Any]) -> Callable[..., Any]:
    """Ignite's marker for ``reset``/``update``: the counters are this process's again, to be reduced at compute.

    Examples:
        >>> from ember.metrics import Metric, reinit__is_reduced
        >>> class Count(Metric):
        ...     @reinit__is_reduced
        ...     def reset(self):
        ...         self._n = 0
        ...     @reinit__is_reduced
        ...     def update(self, output):
        ...         self._n += len(output)
        ...     def compute(self):
        ...         return self._n
        >>> c = Count(); c.update([1, 2, 3]); c.compute()
        3
    """

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        self._is_reduced = False
        return result

    wrapper._ignite_reinit = True  # type: ignore[attr-defined]
    return wrapper


def sync_all_reduce(*attrs: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Ignite's decorator for ``compute``: each named counter reduced over the processes before ``compute`` reads it.

    Summed by default (``"name:MAX"``, ``MIN``, ``PRODUCT`` for the others), once per ``reset``; a checkpoint of the
    metric's engine saves those counters.

    Examples:
        >>> from ember.metrics import Metric, reinit__is_reduced, sync_all_reduce
        >>> class Mean(Metric):
        ...     @reinit__is_reduced
        ...     def reset(self):
        ...         self._total, self._n = 0.0, 0
        ...     @reinit__is_reduced
        ...     def update(self, output):
        ...         self._total += sum(output); self._n += len(output)
        ...     @sync_all_reduce("_total", "_n:SUM")
        ...     def compute(self):
        ...         return self._total / self._n
        >>> m = Mean(); m.update([1.0, 2.0]); m.compute(), m.state_dict()["attributes"]
        (1.5, {'_total': 3.0, '_n': 2})
    """
    parsed = []
    for attr in attrs:
        name, _, op = attr.partition(":")
        if op and op not in _OPS:
            raise ValueError(f"sync_all_reduce: {attr!r} names the operation {op!r}; the operations are {list(_OPS)}.")
        parsed.append((name, op or "SUM"))

    def decorate(compute: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(compute)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not getattr(self, "_is_reduced", False):
                reduce_over_processes(self, parsed)
                self._is_reduced = True
            return compute(self, *args, **kwargs)

        wrapper._ignite_ops = tuple(parsed)  # type: ignore[attr-defined]  # (name, operation) of each counter
        return wrapper

    return decorate


def reduce_over_processes(metric: Any, attrs: list[tuple[str, str]]) -> None:
    """Replace each named counter of ``metric`` with its reduction over the processes (a collective, or nothing)."""
    import jax

    if jax.process_count() == 1:
        return
    mine = {name: _plain(getattr(metric, name)) for name, _ in attrs}
    everyone = [json.loads(text) for text in gather_text(json.dumps(mine))]
    for name, op in attrs:
        setattr(metric, name, _OPS[op]([_value(part[name]) for part in everyone]))


def saved_attributes(cls: type) -> tuple[str, ...]:
    """The counters a checkpoint saves: those ``sync_all_reduce`` names, and Ignite's ``_state_dict_all_req_keys``."""
    synced = tuple(name for name, _ in _parsed(cls))
    declared = tuple(getattr(cls, "_state_dict_all_req_keys", ()))
    return tuple(dict.fromkeys((*synced, *declared)))


def state_dict(metric: Any) -> dict[str, Any]:
    """The saved counters (as JSON values) and the count of updates.

    In a run of several processes, every process's part (a collective, as a checkpoint's gathering of state dicts is).
    """
    import jax

    mine = {
        "attributes": {name: _plain(getattr(metric, name)) for name in saved_attributes(type(metric))},
        "updates": metric._updates,
    }
    if jax.process_count() == 1:
        return mine
    return {"processes": [json.loads(text) for text in gather_text(json.dumps(mine))]}


def load_state_dict(metric: Any, saved: Mapping[str, Any]) -> None:
    """Put back counters saved by `state_dict`: each process its own part.

    On another number of processes, process 0 takes the parts reduced (by ``sync_all_reduce``'s operations) and the
    others start from ``reset``.
    """
    import jax

    parts = saved.get("processes") if isinstance(saved, Mapping) else None
    if parts is None:
        _put_back(metric, saved)
    elif isinstance(parts, list) and len(parts) == jax.process_count():
        _put_back(metric, parts[jax.process_index()])
    elif isinstance(parts, list) and parts and jax.process_index() == 0:
        for part in parts:
            _put_back(metric, part)  # checks each
        ops = dict(_parsed(type(metric)))
        for name in saved_attributes(type(metric)):
            values = [_value(part["attributes"][name]) for part in parts]
            setattr(metric, name, _OPS[ops.get(name, "SUM")](values))
        metric._updates = sum(int(part.get("updates", 0)) for part in parts)
    else:
        metric.reset()
    metric._is_reduced = False


def _put_back(metric: Any, saved: Any) -> None:
    attributes = saved.get("attributes") if isinstance(saved, Mapping) else None
    if not isinstance(attributes, Mapping):
        raise ValueError(f"A saved {type(metric).__name__} holds 'attributes' and 'updates', got {saved!r}.")
    for name in saved_attributes(type(metric)):
        if name not in attributes:
            raise ValueError(f"The saved {type(metric).__name__} has no {name!r}; it holds {sorted(attributes)}.")
        setattr(metric, name, _value(attributes[name]))
    metric._updates = int(saved.get("updates", 0))


def _parsed(cls: type) -> tuple[tuple[str, str], ...]:
    return getattr(getattr(cls, "compute", None), "_ignite_ops", ())


def _value(saved: Any) -> Any:
    return np.asarray(saved) if isinstance(saved, list) else saved


def _plain(value: Any) -> Any:
    """A counter as JSON: a number, or an array as nested lists."""
    if isinstance(value, int | float | bool) or value is None:
        return value
    array = np.asarray(value)
    return array.item() if array.ndim == 0 else array.tolist()
