"""`Throughput`: examples and tokens per second, step-time percentiles, FLOPs, MFU and device memory."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ember.engine import Engine, Events, RemovableEventHandle, collect_handles
from ember.handlers._reporting.loggers import attach_writer
from ember.writers import AsyncWriter, Writer

#: Peak dense bfloat16 FLOP/s per device, by ``jax.Device.device_kind`` (vendor figures; no sparsity).
PEAK_FLOPS: dict[str, float] = {
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H200": 989e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA L4": 121e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,
}


def _examples(batch: Any) -> int:
    """The leading dimension of the batch's first array: the examples in one step (shapes only, no read)."""
    leaves = jax.tree.leaves(batch)
    return int(leaves[0].shape[0]) if leaves and getattr(leaves[0], "shape", ()) else 0


class Throughput:
    """Reports the training speed every ``every`` iterations, without waiting for the device.

    At each report it writes, for the iterations since the last one: ``examples_per_sec`` (and ``tokens_per_sec``
    with ``tokens``), the step time's 50th, 90th and 99th percentiles in milliseconds, ``flops_per_step`` from the
    compiled step's cost analysis (read once, at the first report), the achieved ``tflops_per_sec`` and ``mfu``
    against the device's peak (from a table of common GPUs and TPUs by device kind, or ``peak_flops``; a CPU has
    none, so no MFU there), and device memory in use and at peak, in GiB, where the backend reports it. Step times
    come from the host clock at each ITERATION_COMPLETED: JAX runs at most a few steps ahead, so once the queue is
    full the host waits on the device and its intervals are the device's step times; nothing is read from the device
    for them. With a sharded or data-parallel placement the FLOPs, the MFU and the memory are per device.

    Args:
        writer: where the numbers go (wrapped in an ``AsyncWriter``); ``None`` to keep them in `last` only.
        every: iterations between reports; also the window of the percentiles.
        tag: the prefix of every name.
        examples: ``examples(batch) -> int``; by default the leading dimension of the batch's first array.
        tokens: ``tokens(batch) -> int``, to report tokens per second.
        peak_flops: the device's peak FLOP/s, for a device the table does not know.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from ember.handlers import Throughput
        >>> from ember.training import TrainState, create_trainer
        >>> state = TrainState.create(lambda p, x: x @ p, jnp.zeros((8, 4)), optax.sgd(0.1))
        >>> trainer = create_trainer(state, lambda model, x: jnp.mean(model(x) ** 2))
        >>> speed = Throughput(every=5)
        >>> _ = speed.attach(trainer)
        >>> _ = trainer.run([jnp.ones((16, 8))] * 10)
        >>> sorted(speed.last)[:3], speed.last["flops_per_step"] > 0
        (['examples_per_sec', 'flops_per_step', 'step_ms_p50'], True)
    """

    def __init__(
        self,
        writer: Writer | None = None,
        *,
        every: int = 100,
        tag: str = "perf",
        examples: Callable[[Any], int] | None = None,
        tokens: Callable[[Any], int] | None = None,
        peak_flops: float | None = None,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"`every` must be a positive int, got {every!r}.")
        for name, fn in (("examples", examples), ("tokens", tokens)):
            if fn is not None and not callable(fn):
                raise TypeError(f"`{name}` must be callable as {name}(batch) -> int, got {fn!r}.")
        if peak_flops is not None and (isinstance(peak_flops, bool) or not peak_flops > 0):
            raise ValueError(f"`peak_flops` must be a positive number of FLOP/s, got {peak_flops!r}.")
        self.writer = AsyncWriter(writer) if writer is not None and not isinstance(writer, AsyncWriter) else writer
        self.every, self.tag, self.peak_flops = every, tag, peak_flops
        self.examples, self.tokens = examples or _examples, tokens
        self.last: dict[str, float] = {}
        self._times: deque[float] = deque(maxlen=every + 1)
        self._counts: deque[tuple[int, int]] = deque(maxlen=every)
        self._flops: float | None = None

    def _started(self) -> None:
        self._times.clear()
        self._counts.clear()
        self._times.append(time.perf_counter())

    def _step(self, engine: Engine) -> None:
        self._times.append(time.perf_counter())
        batch = engine.state.batch
        self._counts.append((self.examples(batch), self.tokens(batch) if self.tokens is not None else 0))

    def report(self, engine: Engine) -> dict[str, float]:
        """The numbers over the iterations since the last report; written, and kept in `last`."""
        times = np.diff(np.asarray(self._times))
        seconds = float(times[-len(self._counts) :].sum()) if len(times) else 0.0
        out: dict[str, float] = {}
        if seconds > 0:
            out["examples_per_sec"] = sum(n for n, _ in self._counts) / seconds
            if self.tokens is not None:
                out["tokens_per_sec"] = sum(t for _, t in self._counts) / seconds
            for q in (50, 90, 99):
                out[f"step_ms_p{q}"] = float(np.percentile(times, q)) * 1e3
        if self._flops is None and hasattr(engine, "step_cost"):
            # the ignore below: only training engines have step_cost; checked by the hasattr above
            self._flops = engine.step_cost(engine.state.batch).get("flops", 0.0)  # pyright: ignore[reportAttributeAccessIssue]
        if self._flops:
            out["flops_per_step"] = self._flops
            if seconds > 0:
                achieved = self._flops * len(self._counts) / seconds
                out["tflops_per_sec"] = achieved / 1e12
                device = jax.local_devices()[0]
                peak = self.peak_flops or PEAK_FLOPS.get(device.device_kind)
                if peak:
                    out["mfu"] = achieved / peak
        stats = jax.local_devices()[0].memory_stats() or {}
        for key, name in (("bytes_in_use", "memory_gib"), ("peak_bytes_in_use", "memory_peak_gib")):
            if key in stats:
                out[name] = stats[key] / 2**30
        self.last = out
        if self.writer is not None and out:
            self.writer.write_scalars(engine.state.iteration, {f"{self.tag}/{k}": v for k, v in out.items()})
        last = self._times[-1] if self._times else time.perf_counter()
        self._times.clear()
        self._counts.clear()
        self._times.append(last)
        return out

    def attach(self, engine: Engine) -> RemovableEventHandle:
        """Time every iteration (a clock read); report every ``every`` iterations; return the report's handle.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import Throughput
            >>> handle = Throughput(every=10).attach(Engine(lambda e, b: b))
        """
        with collect_handles() as made:
            if self.writer is not None:
                attach_writer(self.writer, engine)
            engine.add_event_handler(Events.STARTED, self._started)
            engine.add_event_handler(Events.ITERATION_COMPLETED, self._step)
            engine.add_event_handler(Events.ITERATION_COMPLETED(every=self.every), self.report)
        return made.handle
