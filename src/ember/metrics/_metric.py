"""`Metric`: accumulators on device, a jitted merge per update, one host read per compute."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils

from ember.engine import Engine, Events, RemovableEventHandle
from ember.metrics._composite import AttachedMetric, MetricArithmetic
from ember.metrics._saved import PublishedValues, decode_tree, encode_tree
from ember.metrics._usage import EPOCH_WISE, MetricUsage, resolve_usage


class _Unfuse:
    """Takes a fused update out of an engine's compiled step; shaped like a handle."""

    def __init__(self, undo: Callable[[], None]) -> None:
        self.remove = undo


class _Attachment:
    """One metric on one engine: its names, its usage and its handles."""

    def __init__(self, usage: MetricUsage) -> None:
        self.usage = usage
        self.names: list[str] = []
        self.handles: list[RemovableEventHandle | _Unfuse] = []
        self.internal = 0  # composite metrics that rely on this one


class Metric(MetricArithmetic):
    """Base of ember's metrics: a pytree of device accumulators with a pure, jittable merge.

    Subclasses define :meth:`empty` (the zero accumulators), :meth:`batch_state` (one batch's
    accumulators), :meth:`merge` (default: add) and :meth:`finalize` (accumulators to value, with
    ``jnp``). :meth:`update` runs ``merge(state, batch_state(...))`` as one jitted call on device;
    :meth:`compute` is the only host read. Arithmetic between metrics builds a lazy metric.

    The metric reads ``engine.state.output``. A mapping output must hold the keys the metric names in
    :attr:`keys` (``output_transform`` can pick or rename them); its ``"mask"`` entry, if any, marks the
    elements that count (padding, a padded last batch). Otherwise the output (or what
    ``output_transform`` returns) is taken as the positional arguments, a tuple or one value.

    Args:
        output_transform: maps the engine's output to what the metric takes.
        mask_key: the key of a mapping output that holds the mask (``None``: no mask).

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import Accuracy
        >>> acc = Accuracy()
        >>> acc.update({"y_pred": jnp.array([[0.9, 0.1], [0.2, 0.8]]), "y": jnp.array([0, 0])})
        >>> acc.compute()
        0.5
    """

    #: the keys a mapping output must hold, in the order of :meth:`batch_state`'s arguments.
    keys: tuple[str, ...] = ("y_pred", "y")

    def __init__(self, output_transform: Callable[[Any], Any] | None = None, *, mask_key: str | None = "mask") -> None:
        if output_transform is not None and not callable(output_transform):
            raise TypeError(f"`output_transform` must be callable, got {output_transform!r}.")
        self._output_transform = output_transform
        self.mask_key = mask_key
        self._update_fn = jax.jit(self._merge_batch)
        self._attachments: weakref.WeakKeyDictionary[Engine, _Attachment] = weakref.WeakKeyDictionary()
        self._state_value: Any = None
        # While a training engine runs this metric inside its compiled step, the state lives in the
        # engine's Carry (training/_fused.py), at ``_carry_index``; ``_carry_read`` is the carry's call
        # count when ``_state_value`` was last read from it, ``_carry_base`` its count when the state moved in.
        self._carry: Any = None
        self._carry_index = self._carry_base = self._carry_read = 0
        self._own_published: Any = None
        self._own_updates = 0
        self.reset()

    # -- what subclasses define ------------------------------------------------------------------

    def empty(self) -> Any:
        """The accumulators before any update (device arrays), or ``None`` when their shape comes from data."""
        raise NotImplementedError

    def batch_state(self, *args: Any, **kwargs: Any) -> Any:
        """One batch's accumulators from ``(*args, mask=...)``; traced under ``jax.jit``."""
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        """Combine two accumulators; the default adds them leaf by leaf."""
        return jax.tree.map(jnp.add, a, b)

    def finalize(self, state: Any) -> Any:
        """The value from the accumulators, with ``jnp`` (it may run on device)."""
        raise NotImplementedError

    # -- the Ignite interface --------------------------------------------------------------------

    def _merge_batch(self, state: Any, args: tuple[Any, ...], mask: Any) -> Any:
        batch = self.batch_state(*args, mask=mask)
        return batch if state is None else self.merge(state, batch)  # None: shapes known only from data

    def arguments(self, output: Any) -> tuple[tuple[Any, ...], Any]:
        """``(args, mask)`` for :meth:`batch_state` from an engine output."""
        out = self._output_transform(output) if self._output_transform is not None else output
        if isinstance(out, Mapping):
            missing = [k for k in self.keys if k not in out]
            if missing:
                raise KeyError(
                    f"{type(self).__name__} needs the keys {list(self.keys)} in the output, but {missing} "
                    f"{'is' if len(missing) == 1 else 'are'} missing; the output holds {sorted(out)}. "
                    "Pass output_transform= to pick them."
                )
            mask = out.get(self.mask_key) if self.mask_key is not None else None
            return tuple(out[k] for k in self.keys), mask
        return (out if isinstance(out, tuple) else (out,)), None  # type: ignore[return-value]

    def reset(self) -> None:
        """Zero the accumulators.

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember.metrics import Average
            >>> avg = Average()
            >>> avg.update(jnp.array([1.0, 3.0])); avg.reset(); avg.update(jnp.array([5.0]))
            >>> avg.compute()
            5.0
        """
        self._state = _distinct_buffers(self.empty())
        self._updates = 0
        self._restored = False

    def state_dict(self) -> dict[str, Any]:
        """The accumulators (as exact JSON: dtype, shape and values) and the count of updates.

        Attached metrics are saved with their engine (:meth:`ember.Engine.track_state`), so a checkpoint
        of a trainer carries them and a resumed run computes exactly the values of an uninterrupted one.

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember.metrics import Average
            >>> avg = Average()
            >>> avg.update(jnp.array([1.0, 2.0]))
            >>> saved = avg.state_dict()
            >>> saved["updates"], saved["state"]["tuple"][0]
            (1, {'dtype': 'float32', 'shape': [], 'data': [3.0]})
        """
        return {"state": encode_tree(self._state), "updates": self._updates}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Take accumulators saved by :meth:`state_dict`; they survive the STARTED of the resumed run.

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember.metrics import Average
            >>> avg, copy = Average(), Average()
            >>> avg.update(jnp.array([1.0, 2.0]))
            >>> copy.load_state_dict(avg.state_dict())
            >>> copy.compute()
            1.5
        """
        if not isinstance(state_dict, Mapping) or "state" not in state_dict or "updates" not in state_dict:
            raise ValueError(
                f"`state_dict` of {type(self).__name__} must hold 'state' and 'updates', got {state_dict!r}."
            )
        updates = state_dict["updates"]
        if not isinstance(updates, int) or isinstance(updates, bool) or updates < 0:
            raise ValueError(f"`state_dict['updates']` must be a non-negative int, got {updates!r}.")
        state = decode_tree(state_dict["state"])
        fresh = self.empty()
        if fresh is not None and jax.tree.structure(fresh) != jax.tree.structure(state):
            raise ValueError(
                f"The saved state of {type(self).__name__} has the structure {jax.tree.structure(state)}, this metric "
                f"{jax.tree.structure(fresh)}; was it saved by another kind of metric?"
            )
        self._state = _distinct_buffers(state)
        self._updates = updates
        self._restored = True

    def update(self, output: Any) -> None:
        """Merge one batch into the accumulators, on device (no host read).

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember.metrics import Sum
            >>> total = Sum()
            >>> total.update(jnp.array([1.0, 2.0])); total.update(jnp.array([3.0]))
            >>> total.compute()
            6.0
        """
        args, mask = self.arguments(output)
        self._state = self._update_fn(self._state, args, mask)
        self._updates += 1

    def compute(self) -> Any:
        """The value: a float for scalars, a NumPy array otherwise. The only host read.

        Raises:
            RuntimeError: no update since the last reset.

        Examples:
            >>> from ember.metrics import Average
            >>> Average().compute()
            Traceback (most recent call last):
            ...
            RuntimeError: Metric `Average` was computed before any update; attach it to an engine or call ...
        """
        if not self._updates:
            raise RuntimeError(
                f"Metric `{type(self).__name__}` was computed before any update; attach it to an engine or call "
                "`update` first."
            )
        return _to_host(self.finalize(self.global_state()))

    def global_state(self) -> Any:
        """The accumulators of every process merged, leaving this process's own untouched.

        In a multi-process run each process usually updates from its own data, so :meth:`compute` merges
        the processes' accumulators (a collective: every process must compute at the same point, as they
        do when the same engine runs everywhere). Accumulators that are already global arrays (updated from
        a step jitted over a mesh spanning the processes) are returned as they are, so nothing is counted
        twice. In a single process this is just :attr:`state`.

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember.metrics import Sum
            >>> total = Sum()
            >>> total.update(jnp.array([1.0, 2.0]))
            >>> float(total.global_state())
            3.0
        """
        state = self._state
        if jax.process_count() == 1 or _is_global(state):
            return state
        gathered = multihost_utils.process_allgather(state)
        parts = [jax.tree.map(lambda x, i=i: jnp.asarray(x[i]), gathered) for i in range(jax.process_count())]
        return self.merge_processes(parts)

    def merge_processes(self, parts: list[Any]) -> Any:
        """Combine the processes' accumulators; by default :meth:`merge` them in order."""
        merged = parts[0]
        for part in parts[1:]:
            merged = self.merge(merged, part)
        return merged

    @property
    def _state(self) -> Any:
        carry = self._carry
        if carry is not None and self._carry_read != carry.calls:  # steps ran since we last read our part
            self._state_value, self._carry_read = carry.read(self._carry_index), carry.calls
        return self._state_value

    @_state.setter
    def _state(self, value: Any) -> None:
        self._leave_carry()
        self._state_value, self._own_published = value, None

    @property
    def _updates(self) -> int:
        """Updates since the last reset (a compiled call of a training engine counts as one)."""
        carry = self._carry
        return self._own_updates + (carry.calls - self._carry_base if carry is not None else 0)

    @_updates.setter
    def _updates(self, value: int) -> None:
        carry = self._carry
        self._own_updates = value - (carry.calls - self._carry_base if carry is not None else 0)

    @property
    def _published(self) -> Any:
        """The device value published by the current step (:meth:`published_value`), or ``None``."""
        carry = self._carry
        if carry is None:
            return self._own_published
        value = carry.published[self._carry_index]
        return value if carry.slot is None or value is None else value[carry.slot]

    def _enter_carry(self, carry: Any, index: int) -> None:
        """Our state (already packed into ``carry``) now lives there, at ``index``."""
        value = self._state
        self._leave_carry()
        self._state_value, self._own_published = value, None
        self._carry, self._carry_index, self._carry_base, self._carry_read = carry, index, carry.calls, carry.calls

    def _leave_carry(self) -> None:
        """Stop reading the state from a carry (the caller sets it), keeping the update count."""
        carry = self._carry
        if carry is not None:
            self._own_updates += carry.calls - self._carry_base
            self._carry, carry.stale = None, True

    @property
    def state(self) -> Any:
        """The accumulators, on device.

        Examples:
            >>> from ember.metrics import Sum
            >>> float(Sum().state)
            0.0
        """
        return self._state

    # -- attaching -------------------------------------------------------------------------------

    def attach(self, engine: Engine, name: str, usage: str | MetricUsage = EPOCH_WISE) -> AttachedMetric:
        """Reset, update and compute on ``engine``'s events; write ``engine.state.metrics[name]``; return the handle.

        Usages: ``"epoch_wise"`` (default), ``"batch_wise"``, ``"running"``, ``"single_epoch_running"``,
        or :meth:`MetricUsage.filtered`. The metric's handlers run before the engine's other handlers
        on the same event. Attached under two names, it still updates once per iteration.

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember import Engine
            >>> from ember.metrics import Average
            >>> engine = Engine(lambda engine, batch: jnp.asarray(batch, jnp.float32))
            >>> _ = Average().attach(engine, "mean")
            >>> engine.run([[1.0, 2.0], [3.0]]).metrics
            {'mean': 2.0}
        """
        if not isinstance(engine, Engine):
            raise TypeError(f"`engine` must be an ember Engine, got {type(engine).__name__}.")
        if not isinstance(name, str) or not name:
            raise TypeError(f"`name` must be a non-empty string, got {name!r}.")
        att = self._attach_to(engine, resolve_usage(usage), name)
        if name not in att.names:
            att.names.append(name)
            if len(att.names) == 1 and not att.internal:
                att.handles.append(engine.add_priority_handler(att.usage.compute, self._completed, att))
        ref = weakref.ref(engine)  # the handle keeps neither the engine alive, as engine handles do not

        def detach() -> None:
            live = ref()
            if live is not None:
                self.detach(live, name)

        return AttachedMetric(detach)

    def _attach_to(self, engine: Engine, usage: MetricUsage, key: str) -> _Attachment:
        """This metric's attachment to ``engine``, made on first use; its state is saved under ``key``."""
        att = self._attachments.get(engine)
        if att is not None:
            if att.usage != usage:
                raise ValueError(
                    f"This {type(self).__name__} is attached to the engine with usage {att.usage.name!r}; one "
                    f"metric object has one usage per engine. Use another instance for {usage.name!r}."
                )
            return att
        att = self._attachments[engine] = _Attachment(usage)
        # checkpoints of the engine carry our accumulators, and the values metrics published
        att.handles.append(_Unfuse(engine.track_state(f"metric:{key}", self)))
        engine.track_state("state.metrics", _published_values(engine))
        att.handles.append(engine.add_priority_handler(usage.reset, self._reset_at))
        fuse = self.fusable and usage.update is Events.ITERATION_COMPLETED
        per_step = type(self).published_value is not Metric.published_value
        undo = (
            engine.fuse_step_update(
                self, usage.reset, usage.compute, per_step=per_step, names=att.names if per_step else ()
            )
            if fuse
            else None
        )
        if undo is not None:  # updated inside the engine's compiled step: no dispatch of its own
            att.handles.append(_Unfuse(undo))
        else:
            att.handles.append(engine.add_priority_handler(usage.update, self._updated))
        return att

    @property
    def fusable(self) -> bool:
        """Whether a training engine may fold this metric's update into its compiled step.

        True when the accumulators exist before the first batch (:meth:`empty` is not ``None``) and
        :meth:`update` is the standard jitted merge.

        Examples:
            >>> from ember.metrics import Accuracy, Precision
            >>> Accuracy().fusable, Precision().fusable, Precision(num_classes=3).fusable
            (True, False, True)
        """
        return type(self).update is Metric.update and self.empty() is not None

    def set_state(self, state: Any, published: Any = None) -> None:
        """Take accumulators updated elsewhere (inside an engine's compiled step) as one more update.

        ``published`` is :meth:`published_value` of ``state``, computed in the same step as a separate
        output (the accumulators themselves are donated to the next step).

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember.metrics import Sum
            >>> total = Sum()
            >>> total.set_state(total.fused_update(total.state, jnp.array([1.0, 2.0])))
            >>> total.compute()
            3.0
        """
        self._state = state
        self._updates += 1
        self._own_published = published

    def published_value(self, state: Any) -> Any:
        """A device value this metric publishes every step, traced into the step; ``None`` for most metrics.

        Examples:
            >>> from ember.metrics import Sum
            >>> Sum().published_value(Sum().state) is None
            True
        """
        return None

    def fused_update(self, state: Any, output: Any) -> Any:
        """The update as a pure function of the accumulators, traced into a compiled step."""
        args, mask = self.arguments(output)
        return self._merge_batch(state, args, mask)

    def _attach_internal(self, engine: Engine, usage: MetricUsage, key: str) -> None:
        """Attach without a name, for a composite metric that computes from this one."""
        self._attach_to(engine, usage, key).internal += 1

    def _release_internal(self, engine: Engine) -> None:
        """A composite metric no longer computes from this one; detach it if nothing else uses it."""
        att = self._attachments.get(engine)
        if att is not None:
            att.internal -= 1
            if not att.internal and not att.names:
                self.detach(engine)

    def _reset_at(self, engine: Engine) -> None:
        """The reset at the usage's event; a state restored from a checkpoint survives a resumed run's STARTED."""
        if self._restored and engine.last_event_name is Events.STARTED and engine.state.iteration > 0:
            self._restored = False  # the run goes on where the checkpoint left it: so do the accumulators
            return
        self.reset()

    def _updated(self, engine: Engine) -> None:
        self.update(engine.state.output)

    def _completed(self, engine: Engine, att: _Attachment) -> None:
        if not att.names:
            return
        value = self.compute()
        for name in att.names:
            engine.state.metrics[name] = value

    def detach(self, engine: Engine, name: str | None = None) -> None:
        """Stop updating on ``engine`` (for ``name`` only, if given); the metric's handlers are removed.

        Examples:
            >>> from ember import Engine
            >>> from ember.metrics import Average
            >>> engine, avg = Engine(lambda engine, batch: batch), Average()
            >>> _ = avg.attach(engine, "a"); avg.detach(engine)
            >>> avg.is_attached(engine)
            False
        """
        att = self._attachments.get(engine)
        if att is None:
            return
        if name is not None:
            if name in att.names:
                att.names.remove(name)
                engine.state.metrics.pop(name, None)
            if att.names or att.internal:
                return
        for handle in att.handles:
            handle.remove()
        for n in att.names:
            engine.state.metrics.pop(n, None)
        del self._attachments[engine]

    def is_attached(self, engine: Engine, name: str | None = None) -> bool:
        """Whether the metric is attached to ``engine`` (under ``name``, if given).

        Examples:
            >>> from ember import Engine
            >>> from ember.metrics import Average
            >>> engine, avg = Engine(lambda engine, batch: batch), Average()
            >>> _ = avg.attach(engine, "a")
            >>> avg.is_attached(engine), avg.is_attached(engine, "b")
            (True, False)
        """
        att = self._attachments.get(engine)
        return att is not None and (name is None or name in att.names)


_PUBLISHED: weakref.WeakKeyDictionary[Engine, PublishedValues] = weakref.WeakKeyDictionary()


def _published_values(engine: Engine) -> PublishedValues:
    """The one saver of ``engine.state.metrics`` that every metric attached to ``engine`` shares."""
    saver = _PUBLISHED.get(engine)
    if saver is None:
        saver = _PUBLISHED[engine] = PublishedValues(engine.state.metrics)
    return saver


def _is_global(state: Any) -> bool:
    """Whether the accumulators are arrays spanning every process already (so merging would double count)."""
    leaves = jax.tree.leaves(state)
    return bool(leaves) and all(isinstance(x, jax.Array) and not x.is_fully_addressable for x in leaves)


def _distinct_buffers(state: Any) -> Any:
    """``state`` with no buffer used twice (``(zero, zero)``), so an engine can donate it to a compiled step."""
    seen: set[int] = set()

    def unique(x: Any) -> Any:
        if id(x) in seen:
            return jnp.array(x, copy=True)
        seen.add(id(x))
        return x

    return jax.tree.map(unique, state)


def _to_host(value: Any) -> Any:
    host = jax.device_get(value)
    return jax.tree.map(lambda x: x.item() if getattr(x, "ndim", None) == 0 else x, host)
