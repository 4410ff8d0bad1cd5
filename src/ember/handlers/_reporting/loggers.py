"""`ScalarLogger`: write metrics and outputs to a writer on any event, with a step from any engine."""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ember.engine import Engine, Events, EventsList, FilteredEvent, RemovableEventHandle, collect_handles
from ember.handlers._reporting.values import check_names, check_transform, pick
from ember.writers import AsyncWriter, Writer
from ember.writers._writer import array_writing

_async_for: weakref.WeakKeyDictionary[Writer, AsyncWriter] = weakref.WeakKeyDictionary()
# each async writer's registration on each engine; the loggers that share it each hold a share of its handle
_attached: weakref.WeakKeyDictionary[AsyncWriter, weakref.WeakKeyDictionary[Engine, RemovableEventHandle]] = (
    weakref.WeakKeyDictionary()
)


def attach_writer(writer: AsyncWriter, engine: Engine) -> RemovableEventHandle:
    """Raise ``writer``'s thread errors at each ITERATION_COMPLETED of ``engine``; flush at COMPLETED and on errors.

    The handlers that write ([`ScalarLogger`][ember.handlers.ScalarLogger], [`LRMonitor`][ember.handlers.LRMonitor],
    ...) do this for the writer they are given, once per engine; call it for an
    [`AsyncWriter`][ember.writers.AsyncWriter] you write to yourself. Returns the handle that detaches it.

    Examples:
        >>> import pathlib, tempfile
        >>> from ember import Engine
        >>> from ember.handlers import attach_writer
        >>> from ember.writers import AsyncWriter, CsvWriter
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "m.csv"
        >>> w = AsyncWriter(CsvWriter(path))
        >>> trainer = Engine(lambda e, b: w.write_scalars(e.state.iteration, {"x": b}))
        >>> handle = attach_writer(w, trainer)
        >>> _ = trainer.run([1.0, 2.0])
        >>> path.read_text().splitlines()[-1]
        '2,x,2.0'
    """
    if not isinstance(writer, AsyncWriter):
        raise TypeError(f"`writer` must be an ember.writers.AsyncWriter, got {type(writer).__name__}.")

    def on_event(engine: Engine, *error: BaseException) -> None:
        if error:  # the run already fails with its own exception: write what is queued, quietly
            with contextlib.suppress(Exception):
                writer.flush()
        elif engine.last_event_name is Events.COMPLETED:
            writer.flush()
        else:
            writer.raise_if_failed()

    handle = engine.add_event_handler(Events.ITERATION_COMPLETED | Events.COMPLETED | Events.EXCEPTION_RAISED, on_event)
    _attached.setdefault(writer, weakref.WeakKeyDictionary())[engine] = handle
    return handle


def as_async(writer: Writer, engine: Engine) -> AsyncWriter:
    """``writer`` behind a background thread (itself if it already is one), attached to ``engine``.

    Handlers that share one writer share one [`AsyncWriter`][ember.writers.AsyncWriter], so its records keep their order
    on one thread (a writer such as tensorboardX's is not safe to call from two). Call it after registering the handler
    that writes, so the writer's flush at COMPLETED comes after that handler's last write.
    """
    if not isinstance(writer, Writer):
        raise TypeError(f"`writer` must be an ember.writers.Writer, got {type(writer).__name__}.")
    if not isinstance(writer, AsyncWriter):
        shared = _async_for.get(writer)
        if shared is None or shared.closed:
            shared = _async_for[writer] = AsyncWriter(writer)
        writer = shared
    registered = _attached.get(writer, {}).get(engine)
    if registered is not None and registered.active:  # once per engine, however many loggers share the writer
        registered.share()  # this logger's share: removing the logger leaves the writer to the others
    else:
        attach_writer(writer, engine)
    return writer


class ScalarLogger:
    """Writes ``engine.state.metrics`` and scalar outputs to a writer when its event fires.

    Values go to the writer untouched (device arrays included); the [`AsyncWriter`][ember.writers.AsyncWriter] it is
    wrapped in converts them on its own thread, so logging never stalls the step. Names get ``tag/`` in front when a tag
    is given (``val/accuracy``); the step is ``global_step_transform(engine, event_name)`` (Ignite's signature), by
    default the engine's iteration; use [`global_step_from_engine`][ember.handlers.global_step_from_engine] to log an
    evaluator's metrics at the trainer's step. A value that is an array (a confusion matrix, per-class precision) is
    left out, with one warning naming it: writers of scalars show numbers only, and the run goes on.

    Args:
        writer: any [`Writer`][ember.writers.Writer] (wrapped in an ``AsyncWriter`` if it is not one).
        tag: prefix for every name.
        metric_names: ``"all"`` (default), ``None`` or names in ``state.metrics``.
        output_keys: scalar keys of a mapping output to log (``"all"``: every scalar), e.g. ``["loss"]``.
        output_transform: Ignite's: ``output_transform(output)`` returns values to log by name (a mapping,
            e.g. ``lambda out: {"batchloss": out["loss"]}``), or one value, logged as ``output``.
        global_step_transform: ``global_step_transform(engine, event_name) -> int``.

    Examples:
        >>> import io
        >>> from ember import Engine, Events
        >>> from ember.handlers import ScalarLogger
        >>> from ember.writers import ConsoleWriter
        >>> out = io.StringIO()
        >>> engine = Engine(lambda e, b: {"loss": b})
        >>> logger = ScalarLogger(ConsoleWriter(out), output_keys=["loss"])
        >>> _ = logger.attach(engine, Events.ITERATION_COMPLETED(every=2))
        >>> _ = engine.run([0.5, 0.25, 0.125, 0.0625])
        >>> out.getvalue().splitlines()[0]
        'step 2 | loss 0.2500'
    """

    def __init__(
        self,
        writer: Writer,
        *,
        tag: str | None = None,
        metric_names: str | Sequence[str] | None = "all",
        output_keys: str | Sequence[str] | None = None,
        output_transform: Callable[[Any], Any] | None = None,
        global_step_transform: Callable[[Engine, Any], int] | None = None,
    ) -> None:
        if not isinstance(writer, Writer):
            raise TypeError(f"`writer` must be an ember.writers.Writer, got {type(writer).__name__}.")
        if global_step_transform is not None and not callable(global_step_transform):
            raise TypeError(
                "`global_step_transform` must be callable as global_step_transform(engine, event_name), "
                f"got {global_step_transform!r}."
            )
        self.writer: Writer = writer
        self.tag = tag
        self.metric_names = check_names("metric_names", metric_names)
        self.output_keys = check_names("output_keys", output_keys)
        self.output_transform = check_transform(output_transform)
        self.global_step_transform = global_step_transform

    def __call__(self, engine: Engine) -> None:
        """Write the chosen values at ``global_step_transform(engine, event_name)`` (the iteration by default).

        A value of one number goes to ``write_scalars``; an array (a confusion matrix, per-class values) to
        ``write_array``, which a writer that cannot show it leaves out with one note.
        """
        values = pick(engine, self.metric_names, self.output_keys, self.tag, self.output_transform)
        if values:
            transform = self.global_step_transform
            step = int(transform(engine, engine.last_event_name) if transform is not None else engine.state.iteration)
            # a device array's own shape: nothing is read from the device
            arrays = {name: value for name, value in values.items() if math.prod(np.shape(value)) != 1}
            if len(arrays) < len(values):
                self.writer.write_scalars(step, {k: v for k, v in values.items() if k not in arrays})
            for name, value in arrays.items():
                array_writing(self.writer)(step, name, value)

    def attach(
        self, engine: Engine, event: Events | FilteredEvent | EventsList = Events.EPOCH_COMPLETED
    ) -> RemovableEventHandle:
        """Write on ``engine``'s ``event``; the writer's errors surface and it flushes with the engine.

        Examples:
            >>> from ember import Engine, Events
            >>> from ember.handlers import ScalarLogger
            >>> from ember.writers import ConsoleWriter
            >>> handle = ScalarLogger(ConsoleWriter()).attach(Engine(lambda e, b: b), Events.EPOCH_COMPLETED)
        """
        with collect_handles() as made:
            engine.add_event_handler(event, self)
            self.writer = as_async(self.writer, engine)  # after: its flush at COMPLETED follows this handler's write
        return made.handle
