"""`EngineAttachment`: how a metric attaches to an engine (Ignite's ``attach``/``detach``), inherited by `Metric`."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, cast

from ember._protocols import FusableMetric, FusingEngine
from ember.engine import Engine, Events, RemovableEventHandle
from ember.metrics._composite import AttachedMetric
from ember.metrics._saved import PublishedValues
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


class EngineAttachment:
    """Resets, updates and computes a metric on an engine's events; ``Metric`` inherits it.

    Per engine the metric keeps one attachment: its usage, the names it writes in ``state.metrics``, and the handles
    that undo it. A training engine may take the update into its compiled step (``engine.fuse_metric``); otherwise an
    ITERATION_COMPLETED handler runs it. The metric's accumulators are saved with the engine
    ([`ember.Engine.track_state`][ember.engine.Engine.track_state]).

    Examples:
        >>> from ember import Engine
        >>> from ember.metrics import Sum
        >>> engine = Engine(lambda engine, batch: batch)
        >>> handle = Sum().attach(engine, "total")
        >>> engine.run([1.0, 2.0]).metrics
        {'total': 3.0}
    """

    _restored: bool  # the accumulators came from load_state_dict and the resumed run has not started

    def __init__(self) -> None:
        self._attachments: weakref.WeakKeyDictionary[Engine, _Attachment] = weakref.WeakKeyDictionary()

    # what Metric defines
    def reset(self) -> None:
        raise NotImplementedError

    def update(self, output: Any) -> None:
        raise NotImplementedError

    def compute(self) -> Any:
        raise NotImplementedError

    @property
    def fusable(self) -> bool:
        raise NotImplementedError

    @property
    def publishes_per_step(self) -> bool:
        raise NotImplementedError

    def attach(self, engine: Engine, name: str, usage: str | MetricUsage = EPOCH_WISE) -> AttachedMetric:
        """Reset, update and compute on ``engine``'s events; write ``engine.state.metrics[name]``; return the handle.

        Usages, by Ignite's names: ``"epoch_wise"`` (default), ``"batch_wise"``, ``"running_epoch_wise"``,
        ``"running_batch_wise"``, ``"single_epoch_running_batch_wise"``, or
        [`MetricUsage.filtered`][ember.metrics.MetricUsage.filtered]. The metric's handlers run before the engine's
        other handlers on the same event. Attached under two names, it still updates once per iteration.

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
        if not isinstance(name, str):  # any string, "" too, as Ignite takes it
            raise TypeError(f"`name` must be a string, got {type(name).__name__} {name!r}.")
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
        # a training engine may run our update inside its compiled step (see the class docstring)
        undo = None
        if isinstance(engine, FusingEngine) and self.fusable and usage.update is Events.ITERATION_COMPLETED:
            undo = engine.fuse_metric(
                cast(FusableMetric, self), reset=usage.reset, compute=usage.compute, per_step=self.publishes_per_step
            )
        if undo is not None:  # updated inside the engine's compiled step: no dispatch of its own
            att.handles.append(_Unfuse(undo))
        else:
            att.handles.append(engine.add_priority_handler(usage.update, self._updated))
        return att

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
        self.update(self._from_engine(engine.state.output))

    def _from_engine(self, output: Any) -> Any:
        """What ``update`` takes from an engine's output (a metric written Ignite's way: after ``output_transform``)."""
        return output

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
