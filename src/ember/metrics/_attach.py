"""`Attachments`: how a metric attaches to engines (Ignite's ``attach``/``detach``), a part `Metric` holds."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, cast

from ember._protocols import FusableMetric, FusingEngine
from ember.engine import Engine, Events, RemovableEventHandle
from ember.metrics._composite import AttachedMetric
from ember.metrics._saved import PublishedValues
from ember.metrics._usage import MetricUsage, resolve_usage


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


class Attachments:
    """A metric's attachments to engines (Ignite's ``attach``/``detach``): a part every `Metric` holds.

    Per engine it keeps one attachment: the usage, the names the metric writes in ``state.metrics``, and the handles
    that undo it. A training engine may take the update into its compiled step (``engine.fuse_metric``); otherwise an
    ITERATION_COMPLETED handler runs ``update_on(engine)``. At the usage's compute event ``value_on(engine)`` is
    written under every name. The metric's accumulators are saved with the engine
    ([`ember.Engine.track_state`][ember.engine.Engine.track_state]).

    Args:
        metric: the metric attached: its ``reset``, ``fusable``, ``publishes_per_step`` and ``detach`` are used.
        update_on: updates the metric from an engine's output.
        value_on: the value to publish on an engine.

    Examples:
        >>> from ember import Engine
        >>> from ember.metrics import Sum
        >>> engine = Engine(lambda engine, batch: batch)
        >>> handle = Sum().attach(engine, "total")
        >>> engine.run([1.0, 2.0]).metrics
        {'total': 3.0}
    """

    def __init__(self, metric: Any, *, update_on: Callable[[Engine], None], value_on: Callable[[Engine], Any]) -> None:
        self._metric = metric
        self._update_on = update_on
        self._value_on = value_on
        self._by_engine: weakref.WeakKeyDictionary[Engine, _Attachment] = weakref.WeakKeyDictionary()
        self.restored = False  # the accumulators came from load_state_dict and the resumed run has not started

    def attach(self, engine: Engine, name: str, usage: str | MetricUsage) -> AttachedMetric:
        """``Metric.attach``: attach under ``name``; return the handle that detaches it."""
        if not isinstance(engine, Engine):
            raise TypeError(f"`engine` must be an ember Engine, got {type(engine).__name__}.")
        if not isinstance(name, str):  # any string, "" too, as Ignite takes it
            raise TypeError(f"`name` must be a string, got {type(name).__name__} {name!r}.")
        att = self._attach_to(engine, resolve_usage(usage), name)
        if name not in att.names:
            att.names.append(name)
            if len(att.names) == 1 and not att.internal:
                att.handles.append(engine.add_priority_handler(att.usage.compute, self._completed, att))
        ref, metric = weakref.ref(engine), self._metric  # the handle keeps no engine alive, as engine handles do not

        def detach() -> None:
            live = ref()
            if live is not None:
                metric.detach(live, name)

        return AttachedMetric(detach)

    def _attach_to(self, engine: Engine, usage: MetricUsage, key: str) -> _Attachment:
        """The attachment to ``engine``, made on first use; the metric's state is saved under ``key``."""
        metric = self._metric
        att = self._by_engine.get(engine)
        if att is not None:
            if att.usage != usage:
                raise ValueError(
                    f"This {type(metric).__name__} is attached to the engine with usage {att.usage.name!r}; one "
                    f"metric object has one usage per engine. Use another instance for {usage.name!r}."
                )
            return att
        att = self._by_engine[engine] = _Attachment(usage)
        # checkpoints of the engine carry the accumulators, and the values metrics published
        att.handles.append(_Unfuse(engine.track_state(f"metric:{key}", metric)))
        engine.track_state("state.metrics", published_values(engine))
        att.handles.append(engine.add_priority_handler(usage.reset, self._reset_at))
        # a training engine may run the update inside its compiled step (see `Metric`)
        undo = None
        if isinstance(engine, FusingEngine) and metric.fusable and usage.update is Events.ITERATION_COMPLETED:
            undo = engine.fuse_metric(
                cast(FusableMetric, metric),
                reset=usage.reset,
                compute=usage.compute,
                per_step=metric.publishes_per_step,
            )
        if undo is not None:  # updated inside the engine's compiled step: no dispatch of its own
            att.handles.append(_Unfuse(undo))
        else:
            att.handles.append(engine.add_priority_handler(usage.update, self._update_on))
        return att

    def attach_internal(self, engine: Engine, usage: MetricUsage, key: str) -> None:
        """Attach without a name, for a composite metric that computes from this one."""
        self._attach_to(engine, usage, key).internal += 1

    def release_internal(self, engine: Engine) -> None:
        """A composite metric no longer computes from this one; detach it if nothing else uses it."""
        att = self._by_engine.get(engine)
        if att is not None:
            att.internal -= 1
            if not att.internal and not att.names:
                self._metric.detach(engine)

    def _reset_at(self, engine: Engine) -> None:
        """The reset at the usage's event; a state restored from a checkpoint survives a resumed run's STARTED."""
        if self.restored and engine.last_event_name is Events.STARTED and engine.state.iteration > 0:
            self.restored = False  # the run goes on where the checkpoint left it: so do the accumulators
            return
        self._metric.reset()

    def _completed(self, engine: Engine, att: _Attachment) -> None:
        if not att.names:
            return
        value = self._value_on(engine)
        for name in att.names:
            engine.state.metrics[name] = value

    def detach(self, engine: Engine, name: str | None = None) -> None:
        """``Metric.detach``: stop updating on ``engine`` (for ``name`` only, if given)."""
        att = self._by_engine.get(engine)
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
        del self._by_engine[engine]

    def is_attached(self, engine: Engine, name: str | None = None) -> bool:
        """``Metric.is_attached``: whether attached to ``engine`` (under ``name``, if given)."""
        att = self._by_engine.get(engine)
        return att is not None and (name is None or name in att.names)


_PUBLISHED: weakref.WeakKeyDictionary[Engine, PublishedValues] = weakref.WeakKeyDictionary()


def published_values(engine: Engine) -> PublishedValues:
    """The one saver of ``engine.state.metrics`` that every metric attached to ``engine`` shares."""
    saver = _PUBLISHED.get(engine)
    if saver is None:
        saver = _PUBLISHED[engine] = PublishedValues(engine.state.metrics)
    return saver
