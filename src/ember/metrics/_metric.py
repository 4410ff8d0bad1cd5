"""`Metric`: accumulators on device, a jitted merge per update, one host read per compute."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from ember._multiprocess import gather_text
from ember.errors import NotComputableError
from ember.metrics._attach import Attachments
from ember.metrics._composite import AttachedMetric, MetricArithmetic
from ember.metrics._ignite_style import check_device, ignite_update_argument, is_ignite_style
from ember.metrics._ignite_style import load_state_dict as ignite_load_state_dict
from ember.metrics._ignite_style import state_dict as ignite_state_dict
from ember.metrics._saved import distinct_buffers, encode_tree, is_global, own_part
from ember.metrics._usage import EPOCH_WISE, MetricUsage

if TYPE_CHECKING:
    from ember.engine import Engine


class Metric(MetricArithmetic):
    """Base of ember's metrics: a pytree of device accumulators with a pure, jittable merge.

    Subclasses define [`empty`][ember.metrics.Metric.empty] (the zero accumulators),
    [`batch_state`][ember.metrics.Metric.batch_state] (one batch's accumulators), [`merge`][ember.metrics.Metric.merge]
    (default: add) and [`finalize`][ember.metrics.Metric.finalize] (accumulators to value, with ``jnp``).
    [`update`][ember.metrics.Metric.update] runs ``merge(state, batch_state(...))`` as one jitted call on device;
    [`compute`][ember.metrics.Metric.compute] is the only host read. Arithmetic between metrics builds a lazy metric.

    Updates inside a compiled step: a training engine ([`ember.training.create_trainer`][ember.training.create_trainer])
    offers ``engine.fuse_metric(metric, reset=, compute=, per_step=)`` and, when it accepts, runs
    [`fused_update`][ember.metrics.Metric.fused_update] inside its compiled step for every batch:
    [`state`][ember.metrics.Metric.state] goes in beside the train state (donated: copy an array of it you keep across
    steps), and the engine hands back the new accumulators, with this step's
    [`published_value`][ember.metrics.Metric.published_value], through [`set_state`][ember.metrics.Metric.set_state]. A
    metric whose [`update`][ember.metrics.Metric.update] is the standard merge and whose accumulators exist before the
    first batch is [`fusable`][ember.metrics.Metric.fusable]; others are updated by an ITERATION_COMPLETED handler.

    The metric reads ``engine.state.output``. A mapping output must hold the keys the metric names in
    `keys` (``output_transform`` can pick or rename them); its ``"mask"`` entry, if any, marks the
    elements that count (padding, a padded last batch). Otherwise the output (or what
    ``output_transform`` returns) is taken as the positional arguments: a tuple or a list (Ignite's
    ``[y_pred, y]``), or one value. A metric written Ignite's way (its own ``reset``, ``update`` and ``compute``)
    runs as written, on the host: see [`sync_all_reduce`][ember.metrics.sync_all_reduce].

    Args:
        output_transform: maps the engine's output to what the metric takes.
        device: Ignite's argument, accepted and checked (``None``, ``"cpu"``, a JAX device or sharding), not used.
        skip_unrolling: Ignite's argument, accepted (ember unrolls nothing).
        mask_key: the key of a mapping output that holds the mask (``None``: no mask).

    Examples:
        >>> import jax.numpy as jnp
        >>> from ember.metrics import Accuracy
        >>> acc = Accuracy()
        >>> acc.update({"y_pred": jnp.array([[0.9, 0.1], [0.2, 0.8]]), "y": jnp.array([0, 0])})
        >>> acc.compute()
        0.5
    """

    #: the keys a mapping output must hold, in the order of ``batch_state``'s arguments.
    keys: tuple[str, ...] = ("y_pred", "y")
    #: ``update`` is exactly ``merge(state, batch_state(...))``, what ``fused_update`` traces; a subclass that keeps
    #: its batches another way (``Collect``) sets ``False`` and is then updated by a handler, outside the step.
    updates_by_merge: ClassVar[bool] = True
    #: ``published_value`` returns a value every step (``RunningAverage``), which the step computes and publishes.
    publishes_values: ClassVar[bool] = False

    def __init__(
        self,
        output_transform: Callable[[Any], Any] | None = None,
        device: Any = None,
        skip_unrolling: bool = False,
        *,
        mask_key: str | None = "mask",
    ) -> None:
        if output_transform is not None and not callable(output_transform):
            raise TypeError(f"`output_transform` must be callable, got {output_transform!r}.")
        check_device(device)
        self._ignite_style = is_ignite_style(type(self), Metric)  # reset/update/compute of its own, on the host
        self._output_transform = output_transform
        self.mask_key = mask_key
        self._update_fn = jax.jit(self._merge_batch)
        self._attached = Attachments(self, update_on=self._update_on, value_on=self._value_on)  # per engine
        self._zeros: Any = _UNSET  # empty() fetched once: a reset copies it on the host and dispatches nothing
        # the accumulators, the value the last step published (published_value, on device), the updates counted
        self._state, self._published, self._updates = None, None, 0
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
        """``(args, mask)`` for [`batch_state`][ember.metrics.Metric.batch_state] from an engine output."""
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
        return (tuple(out) if isinstance(out, tuple | list) else (out,)), None  # Ignite's [y_pred, y] too

    def _update_on(self, engine: Engine) -> None:
        """The update from ``engine``'s output; a metric written Ignite's way takes it after ``output_transform``."""
        output = engine.state.output
        if self._ignite_style:
            self._updates += 1
            output = ignite_update_argument(self, output)
        self.update(output)

    def _value_on(self, engine: Engine) -> Any:
        """The value published in ``engine.state.metrics`` at the usage's compute event."""
        return self.compute()

    # -- on engines ------------------------------------------------------------------------------

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
        return self._attached.attach(engine, name, usage)

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
        self._attached.detach(engine, name)

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
        return self._attached.is_attached(engine, name)

    def _attach_internal(self, engine: Engine, usage: MetricUsage, key: str) -> None:
        self._attached.attach_internal(engine, usage, key)

    def _release_internal(self, engine: Engine) -> None:
        self._attached.release_internal(engine)

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
        self._updates, self._published, self._attached.restored = 0, None, False
        if not self._ignite_style:
            self._state = self._empty()  # buffers of its own: a compiled step donates them

    def state_dict(self) -> dict[str, Any]:
        """The accumulators (as exact JSON: dtype, shape and values) and the count of updates.

        Attached metrics are saved with their engine ([`ember.Engine.track_state`][ember.engine.Engine.track_state]), so
        a checkpoint of a trainer carries them and a resumed run computes exactly the values of an uninterrupted one.

        In a multi-process run where each process accumulates its own data, every process's part is saved, under
        ``"processes"`` (gathered: a collective, called by every process at once, as a checkpoint does), and the
        saved dict is the same on every process. Accumulators that are already global arrays are saved once.

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember.metrics import Average
            >>> avg = Average()
            >>> avg.update(jnp.array([1.0, 2.0]))
            >>> saved = avg.state_dict()
            >>> saved["updates"], saved["state"]["tuple"][0]
            (1, {'dtype': 'float32', 'shape': [], 'data': [3.0]})
        """
        if self._ignite_style:
            return ignite_state_dict(self)
        mine = {"state": encode_tree(self._saved_state()), "updates": self._updates}
        if jax.process_count() == 1 or is_global(self._state):
            return mine
        return {"processes": [json.loads(text) for text in gather_text(json.dumps(mine))]}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Take accumulators saved by ``state_dict``; they survive the STARTED of the resumed run.

        Saved from several processes, each process takes its own part. Resumed on another number of processes,
        process 0 takes the parts merged and the others start empty (every count of updates is the total), so the
        global value is the same.

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember.metrics import Average
            >>> avg, copy = Average(), Average()
            >>> avg.update(jnp.array([1.0, 2.0]))
            >>> copy.load_state_dict(avg.state_dict())
            >>> copy.compute()
            1.5
        """
        if self._ignite_style:
            ignite_load_state_dict(self, state_dict)
            self._attached.restored = True
            return
        state, updates = own_part(type(self).__name__, state_dict, self.empty(), self.merge_processes, self._empty)
        self._restore_state(state)
        self._updates, self._published, self._attached.restored = updates, None, True

    def _saved_state(self) -> Any:
        """What [`state_dict`][ember.metrics.Metric.state_dict] saves: the accumulators (a subclass may keep more)."""
        return self._state

    def _restore_state(self, state: Any) -> None:
        """Take back what `_saved_state` gave, decoded from a checkpoint."""
        self._state = distinct_buffers(state)

    def _empty(self) -> Any:
        """Fresh accumulators in host memory (as a reset leaves them)."""
        if self._zeros is _UNSET:
            self._zeros = jax.device_get(self.empty())
        return jax.tree.map(np.array, self._zeros)

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
        self._published = None

    def compute(self) -> Any:
        """The value: a float for scalars, a NumPy array otherwise. The only host read.

        Raises:
            NotComputableError: no update since the last reset (a ``RuntimeError``, Ignite's name).

        Examples:
            >>> from ember.metrics import Average
            >>> Average().compute()
            Traceback (most recent call last):
            ...
            ember.errors.NotComputableError: Metric `Average` was computed before any update; attach it to an ...
        """
        state, updated = self._merged()  # every process takes part, the ones that saw no data too
        if not updated:
            raise NotComputableError(
                f"Metric `{type(self).__name__}` was computed before any update; attach it to an engine or call "
                "`update` first."
            )
        return _to_host(self.finalize(state))

    def global_state(self) -> Any:
        """The accumulators of every process merged, leaving this process's own untouched.

        In a multi-process run each process usually updates from its own data, so
        [`compute`][ember.metrics.Metric.compute] merges the accumulators of the processes that were updated (a
        collective: every process computes at the same point, one that saw no data too). Accumulators that are already
        global arrays (from a step jitted over a mesh spanning the processes) are returned as they are.

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember.metrics import Sum
            >>> total = Sum(); total.update(jnp.array([1.0, 2.0]))
            >>> float(total.global_state())
            3.0
        """
        return self._merged()[0]

    def _merged(self) -> tuple[Any, bool]:
        """The processes' accumulators merged, of those that were updated; and whether any was."""
        state = self._state
        if jax.process_count() == 1 or is_global(state):
            return state, self._updates > 0
        flags, gathered = multihost_utils.process_allgather((np.int32(self._updates > 0), state))
        parts = [jax.tree.map(lambda x, i=i: jnp.asarray(x[i]), gathered) for i in range(len(flags)) if flags[i]]
        return (self.merge_processes(parts), True) if parts else (state, False)

    def merge_processes(self, parts: list[Any]) -> Any:
        """Combine the processes' accumulators; by default [`merge`][ember.metrics.Metric.merge] them in order."""
        return functools.reduce(self.merge, parts)

    @property
    def state(self) -> Any:
        """The accumulators: on device once updated; after a reset, zeros in host memory (NumPy).

        A reset copies the zeros [`empty`][ember.metrics.Metric.empty] gave the first time, so it dispatches no
        device work; the first update (or the compiled step the metric is fused into) puts them on device.

        Examples:
            >>> import jax.numpy as jnp
            >>> from ember.metrics import Sum
            >>> total = Sum()
            >>> type(total.state).__name__, float(total.state)
            ('ndarray', 0.0)
            >>> total.update(jnp.array([1.0, 2.0])); type(total.state).__name__
            'ArrayImpl'
        """
        return self._state

    @property
    def fusable(self) -> bool:
        """Whether a training engine may fold this metric's update into its compiled step.

        True when the accumulators exist before the first batch ([`empty`][ember.metrics.Metric.empty] is not ``None``)
        and the class declares its update the standard merge (``updates_by_merge``).

        Examples:
            >>> from ember.metrics import Accuracy, Precision
            >>> Accuracy().fusable, Precision().fusable, Precision(num_classes=3).fusable
            (True, False, True)
        """
        return not self._ignite_style and self.updates_by_merge and self.empty() is not None

    def set_state(self, state: Any, published: Any = None) -> None:
        """Take accumulators updated elsewhere (inside an engine's compiled step) as one more update.

        A training engine calls this after each compiled call that ran
        [`fused_update`][ember.metrics.Metric.fused_update] (the class docstring has the whole contract). ``published``
        is [`published_value`][ember.metrics.Metric.published_value] of ``state``, computed in the same step as an
        output of its own (the accumulators are donated to the next step).

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
        self._published = published

    @property
    def publishes_per_step(self) -> bool:
        """Whether the metric publishes a value every step (its class declares ``publishes_values``).

        Examples:
            >>> from ember.metrics import RunningAverage, Sum
            >>> Sum().publishes_per_step, RunningAverage(output_transform=float).publishes_per_step
            (False, True)
        """
        return self.publishes_values

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


_UNSET = object()


def _to_host(value: Any) -> Any:
    host = jax.device_get(value)
    return jax.tree.map(lambda x: x.item() if getattr(x, "ndim", None) == 0 else x, host)
