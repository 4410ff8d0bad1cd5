"""`AsyncWriter`: one ordered background thread per run does all the writing, and all the host copies."""

from __future__ import annotations

import functools
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ember.writers._histogram import Histogram, histogram
from ember.writers._writer import Writer, array_writing, check_outcome, synced

_STOP = object()


def _own(values: list[Any]) -> list[Any]:
    """``values`` with every device array replaced by a copy of its own, on its device, its transfer to the host begun.

    The copy is dispatched, not awaited: the training thread goes on at once, and the next step may donate the
    original (a train state's parameters, a metric's accumulators) without deleting what the writer's thread reads.
    An array replicated over several processes is copied from this process's replica, so nothing here is a
    collective that one process might enter alone.
    """
    import jax

    arrays = [i for i, v in enumerate(values) if isinstance(v, jax.Array)]
    if not arrays:
        return values
    local = []
    for i in arrays:
        v = values[i]
        if not v.is_fully_addressable:
            if not v.is_fully_replicated:
                raise ValueError(
                    f"A value handed to the writer is an array of shape {v.shape} sharded across processes; no "
                    "process holds it whole. Write a summary of it (a histogram: ember.writers.histogram, or a "
                    "reduction computed on every process) instead."
                )
            v = v.addressable_data(0)
        local.append(v)
    out = list(values)
    for i, copy in zip(arrays, _copied(local), strict=True):
        start_host_copy(copy)
        out[i] = copy
    return out


def start_host_copy(value: Any) -> None:
    """Begin copying a device array to the host, where that is a copy (a value of any other kind is left alone).

    An array on a CPU device is in host memory already: asking for its copy while the computation that makes it is
    still queued costs the calling thread about 0.2 ms on XLA:CPU (the training thread, for a check every step).
    """
    copy = getattr(value, "copy_to_host_async", None)
    if not callable(copy):
        return
    sharding = getattr(value, "sharding", None)
    if sharding is None or not _in_host_memory(sharding):
        copy()


@functools.lru_cache(maxsize=256)
def _in_host_memory(sharding: Any) -> bool:
    return all(device.platform == "cpu" for device in sharding.device_set)


def _copied(arrays: list[Any]) -> list[Any]:
    return _copier()(arrays)


@functools.cache
def _copier() -> Any:
    import jax
    import jax.numpy as jnp

    return jax.jit(lambda xs: [jnp.copy(x) for x in xs])  # inputs not donated: new buffers, never aliases


def _host_scalars(values: Mapping[str, Any]) -> dict[str, float]:
    return {name: float(np.asarray(v)) for name, v in values.items()}


def _on_host(values: Any) -> Any:
    return values.on_host() if isinstance(values, Histogram) else np.asarray(values)


def is_primary_process() -> bool:
    """Whether this is process 0 of a (possibly multi-process) JAX run: the one that writes files.

    Examples:
        >>> from ember.writers import is_primary_process
        >>> is_primary_process()
        True
    """
    import jax

    return jax.process_index() == 0


class AsyncWriter(Writer):
    """Runs ``writer`` on one background thread, in call order; device arrays become numbers there.

    A call returns at once, holding nothing of the caller's: a device value is copied on its device (dispatched, not
    awaited) and the copy starts its transfer to the host, which the thread waits for; so logging never stalls the
    training loop, and the next step may donate what was logged (the train state's parameters) safely. A histogram of a
    device array is counted on its devices at the call ([`histogram`][ember.writers.histogram]; on every process, for
    an array sharded across processes) and only the counts cross to the host.

    What the thread writes reaches the writer's files within ``flush_secs``: the thread flushes the writer that long
    after the first record it has not flushed yet, whether more records follow or not, so ``tail -f metrics.jsonl``
    follows a run and a killed run's log holds all but its last seconds ([`flush`][ember.writers.AsyncWriter.flush]
    before a checkpoint makes it all: ``ember train`` does).

    An exception on the thread is kept and raised by the next call,
    [`raise_if_failed`][ember.writers.AsyncWriter.raise_if_failed] or [`flush`][ember.writers.AsyncWriter.flush] (once;
    later records are dropped, since the writer is broken). Only the primary process writes unless
    ``primary_only=False``. `attach` makes an engine surface errors at every iteration and flush at COMPLETED and on an
    exception.

    Args:
        writer: the writer to drive (often a [`MultiWriter`][ember.writers.MultiWriter]).
        primary_only: drop every record on processes other than process 0.
        max_pending: records queued before a call waits for the thread (bounds memory).
        flush_secs: the longest a written record waits for a flush (TensorBoard's own writers flush every 120 s).

    Examples:
        >>> import io
        >>> import jax.numpy as jnp
        >>> from ember.writers import AsyncWriter, ConsoleWriter
        >>> out = io.StringIO()
        >>> w = AsyncWriter(ConsoleWriter(out))
        >>> w.write_scalars(1, {"loss": jnp.float32(0.5)})
        >>> w.close(); out.getvalue().splitlines()
        ['step 1 | loss 0.5000']
    """

    def __init__(
        self, writer: Writer, *, primary_only: bool = True, max_pending: int = 10_000, flush_secs: float = 5.0
    ) -> None:
        if not isinstance(writer, Writer):
            raise TypeError(f"`writer` must be an ember.writers.Writer, got {type(writer).__name__}.")
        if not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"`max_pending` must be a positive int, got {max_pending!r}.")
        if isinstance(flush_secs, bool) or not isinstance(flush_secs, int | float) or not 0 < flush_secs < math.inf:
            raise ValueError(f"`flush_secs` must be a positive number of seconds, got {flush_secs!r}.")
        self.flush_secs = float(flush_secs)
        self.writer = writer
        self.active = not primary_only or is_primary_process()
        self._queue: queue.Queue[Any] = queue.Queue(max_pending)
        self._error: BaseException | None = None
        self._reported = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def _work(self) -> None:
        unflushed: float | None = None  # when the oldest record not flushed yet was written
        while True:
            wait = None if unflushed is None else max(0.0, unflushed + self.flush_secs - time.monotonic())
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:  # nothing more came within flush_secs of the oldest unflushed record
                self._run(self.writer.flush)
                unflushed = None
                continue
            if item is _STOP:
                return
            fn, args = item
            self._run(fn, *args)
            if fn in (self.writer.flush, synced(self.writer)):
                unflushed = None
            elif fn is not threading.Event.set:
                unflushed = time.monotonic() if unflushed is None else unflushed
                if time.monotonic() - unflushed >= self.flush_secs:  # records keep coming: flush on time anyway
                    self._run(self.writer.flush)
                    unflushed = None

    def _run(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn`` on the thread; an exception is kept for the caller's thread (later records are dropped)."""
        if self._error is None or fn is threading.Event.set:
            try:
                fn(*args)
            except BaseException as e:  # the loop goes on draining
                self._error = e

    def _put(self, fn: Callable[..., Any], *args: Any) -> None:
        self.raise_if_failed()
        if self._closed:
            raise RuntimeError("This AsyncWriter is closed.")
        if not self.active or self._error is not None:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="ember-writer", daemon=True)
            self._thread.start()
        self._queue.put((fn, args))

    def raise_if_failed(self) -> None:
        """Raise the writer thread's exception, if there is one not raised yet."""
        if self._error is not None and not self._reported:
            self._reported = True
            self._error.add_note("(raised on ember's writer thread)")
            raise self._error

    def write_scalars(self, step: int, values: Mapping[str, Any]) -> None:
        """Queue scalars; device values are copied now and converted on the thread."""
        if self.active:
            values = dict(zip(values, _own(list(values.values())), strict=True))
        self._put(lambda: self.writer.write_scalars(step, _host_scalars(values)))

    def write_histogram(self, step: int, name: str, values: Any) -> None:
        """Queue a histogram; a device array's is counted now, on its devices, on every process."""
        import jax

        if isinstance(values, jax.Array):
            values = histogram(values)  # new arrays, replicated: the next step may donate ``values``
        self._put(lambda: self.writer.write_histogram(step, name, _on_host(values)))

    def write_image(self, step: int, name: str, image: Any) -> None:
        """Queue an image; a device array is copied now and read on the thread."""
        if self.active:
            (image,) = _own([image])
        self._put(lambda: self.writer.write_image(step, name, np.asarray(image)))

    def write_text(self, step: int, name: str, text: str) -> None:
        """Queue text."""
        self._put(self.writer.write_text, step, name, text)

    def write_array(self, step: int, name: str, array: Any) -> None:
        """Queue an array; a device array is copied now and read on the thread."""
        if self.active:
            (array,) = _own([array])
        self._put(lambda: array_writing(self.writer)(step, name, np.asarray(array)))

    def write_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, float] | None = None) -> None:
        """Queue hyperparameters."""
        self._put(self.writer.write_hparams, dict(hparams), dict(metrics or {}))

    def resume_at(self, step: int) -> None:
        """Queue the writers' ``resume_at(step)``, before anything the resumed run logs."""
        self._put(self.writer.resume_at, step)

    def set_outcome(self, outcome: str) -> None:
        """Queue how the run ended (``"finished"``, ``"failed"``, ``"killed"``) for the writers, before ``close``."""
        self._put(self.writer.set_outcome, check_outcome(outcome))

    def __enter__(self) -> AsyncWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        """Close; a ``with`` block left by an exception ends the run ``"failed"`` (``"killed"`` for Ctrl-C)."""
        if kind is not None and not self._closed:
            self.set_outcome("killed" if issubclass(kind, KeyboardInterrupt) else "failed")
        self.close()

    def flush(self) -> None:
        """Wait until everything queued is written and flushed; raise the thread's error if any."""
        self._wait_for(self.writer.flush)

    def sync(self) -> None:
        """Wait until everything queued is written, flushed and fsynced (`Writer.sync`); raise the thread's error.

        ``ember train`` calls it before each checkpoint it keeps to resume from: once the checkpoint of step S is on
        disk, so is every record up to S, a power loss included.

        Examples:
            >>> import tempfile, pathlib
            >>> from ember.writers import AsyncWriter, JsonlWriter
            >>> path = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl"
            >>> w = AsyncWriter(JsonlWriter(path))
            >>> w.write_scalars(1, {"loss": 0.5}); w.sync(); path.read_text().count("loss")
            1
            >>> w.close()
        """
        self._wait_for(synced(self.writer))

    def _wait_for(self, last: Callable[[], None]) -> None:
        if self._thread is not None and not self._closed:
            self._put(last)
            done = threading.Event()
            self._queue.put((threading.Event.set, (done,)))
            done.wait()
        self.raise_if_failed()

    def close(self) -> None:
        """Flush, close the writer, stop the thread; raise the thread's error if any."""
        if self._closed:
            return
        if self._thread is not None:
            self._put(self.writer.close)
            self._queue.put(_STOP)
            self._thread.join()
        elif self.active:
            self.writer.close()
        self._closed = True
        self.raise_if_failed()

    @property
    def closed(self) -> bool:
        """Whether [`close`][ember.writers.AsyncWriter.close] was called.

        Examples:
            >>> from ember.writers import AsyncWriter, ConsoleWriter
            >>> w = AsyncWriter(ConsoleWriter()); w.close(); w.closed
            True
        """
        return self._closed
