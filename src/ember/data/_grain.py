"""`GrainPipeline`: a Grain pipeline over a random-access source, arranged the way an engine runs it."""

from __future__ import annotations

import atexit
import contextlib
import gc
import mmap
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from ember._extras import require
from ember.data._position import Mapped
from ember.errors import RecordError

READ_THREADS = 4  # threads that build batches, in this process or in each worker
READ_AHEAD = 8  # batches built ahead at most (Grain's default, 500, holds 500 batches in memory)
WORKER_AHEAD = 4  # batches each worker process keeps ready (Grain's default, 1, leaves the step waiting)


class GrainPipeline:
    """Batches from a random-access source through Grain: shuffled every pass, transformed, in worker processes.

    The batches are [`ArrayDataset`][ember.data.ArrayDataset]'s for the same arguments (pass ``e`` is the permutation
    seeded by ``(seed, e)``, the last short batch of a pass dropped; ``len()`` is ``len(source) // batch_size``), as one
    endless stream whose epochs the engine counts, read through Grain (``MapDataset``, ``batch``, ``mp_prefetch``):
    examples are read and transformed in ``worker_count`` processes. Random transforms draw from a generator seeded by
    the example's place in the global stream, so a run gives the same batches however many processes or workers read it.

    Its iterators follow the resumable-iterator protocol, so engines save its position in their checkpoints, resume it
    exactly, and close its worker processes when a run stops. A position saved from another pipeline (another source
    length, batch size, seed, shuffling, shard or worker count) is refused with an error naming what differs; a record
    that fails to be read or transformed fails the run with [`RecordError`][ember.data.RecordError], naming it.

    Any Grain ``DataLoader``, ``MapDataset`` or ``IterDataset`` also runs in an engine as it is; this class
    adds what Grain leaves to the training loop: per-process parts of a global batch, the epoch length,
    errors naming the record that failed, and the check of a resumed position.

    Args:
        source: random access (``len`` and ``__getitem__``): [`NpySource`][ember.data.NpySource], a Grain source, a
            list.
        batch_size: the global batch size; each of ``count`` processes gets ``batch_size // count`` examples of every
            batch (its own slice, as [`ArrayDataset`][ember.data.ArrayDataset]'s ``shard`` gives), so ``count``
            processes together see the batches one process would.
        transforms: applied to each example in order: a callable ``fn(example)``, a
            ``grain.transforms.Map``, or a ``grain.transforms.RandomMap`` (its ``random_map(example, rng)``
            gets a NumPy Philox generator keyed by ``seed``, its counter at the example's place in the
            stream, as Grain's own random maps do). Worker processes unpickle them: define them at
            module level.
        shuffle: shuffle the examples, anew on every pass.
        seed: the seed of the shuffle and of random transforms.
        worker_count: worker processes that read and transform (Grain's ``mp_prefetch``); 0 reads in
            this process. With workers, start the run under ``if __name__ == "__main__":``, as Python's
            ``spawn`` start method requires.
        shard: ``(index, count)``, or ``"auto"`` for ``(jax.process_index(), jax.process_count())``.

    Examples:
        >>> import numpy as np
        >>> from ember.data import GrainPipeline
        >>> data = GrainPipeline(np.arange(10), batch_size=4, transforms=[lambda x: x * 10])
        >>> len(data), [b.tolist() for b, _ in zip(data, range(3))]  # two batches a pass; 80 and 90 dropped
        (2, [[0, 10, 20, 30], [40, 50, 60, 70], [0, 10, 20, 30]])
    """

    def __init__(
        self,
        source: Any,
        *,
        batch_size: int,
        transforms: Sequence[Any] = (),
        shuffle: bool = False,
        seed: int = 0,
        worker_count: int = 0,
        shard: tuple[int, int] | str = "auto",
    ) -> None:
        grain = require("grain", feature="GrainPipeline", package="grain", extra="grain")

        if not (callable(getattr(source, "__len__", None)) and callable(getattr(source, "__getitem__", None))):
            raise TypeError(f"`source` must support len() and [index] (random access), got {type(source).__name__}.")
        for name, value, least in (("batch_size", batch_size, 1), ("worker_count", worker_count, 0), ("seed", seed, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"`{name}` must be an int >= {least}, got {value!r}.")
        if shard == "auto":
            shard = (jax.process_index(), jax.process_count())
        if not (isinstance(shard, tuple) and len(shard) == 2 and all(isinstance(v, int) for v in shard)) or not (
            0 <= shard[0] < shard[1]
        ):
            raise ValueError(f'`shard` must be "auto" or (index, count) with 0 <= index < count, got {shard!r}.')
        if batch_size % shard[1]:
            raise ValueError(
                f"`batch_size` (the global batch, {batch_size}) must divide by the {shard[1]} processes reading it, "
                f"so every process gets an equal part of every batch; use a multiple of {shard[1]}."
            )
        if len(source) < batch_size:
            raise ValueError(f"`batch_size`={batch_size} exceeds the {len(source)} examples of `source`.")
        steps = [_transform(t, f"transforms[{i}]") for i, t in enumerate(transforms)]
        self.source, self.batch_size, self.shuffle, self.seed = source, batch_size, shuffle, seed
        self.worker_count, self.shard = worker_count, shard
        stream = _Stream(source, batch_size, shard, shuffle, seed, steps)
        batches = grain.MapDataset.source(stream).batch(stream.part, drop_remainder=True)
        self.dataset = batches.to_iter_dataset(
            grain.ReadOptions(num_threads=READ_THREADS, prefetch_buffer_size=READ_AHEAD)
        )
        if worker_count:
            options = grain.MultiprocessingOptions(num_workers=worker_count, per_worker_buffer_size=WORKER_AHEAD)
            self.dataset = self.dataset.mp_prefetch(options, worker_init_fn=exit_with_parent)

    def __len__(self) -> int:
        return len(self.source) // self.batch_size

    def __iter__(self) -> Iterator[Any]:
        if self.worker_count:
            _accept_unparsed_flags()
        return _Position(iter(self.dataset), self._identity())

    def _identity(self) -> dict[str, Any]:
        described = repr(self.source)
        return {
            "source": described if len(described) <= 200 else type(self.source).__name__,
            "examples": len(self.source),
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "shard": list(self.shard),
            "worker_count": self.worker_count,
        }

    def __repr__(self) -> str:
        return (
            f"GrainPipeline({len(self.source)} examples, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"seed={self.seed}, worker_count={self.worker_count}, shard={self.shard})"
        )


class _Position(Mapped):
    """A pipeline's iterator: Grain's position, with the pipeline it belongs to, checked when restored.

    Batches from worker processes arrive in shared memory, which Grain unlinks when the array is collected; each is
    handed on as an array of its own (one copy), so no segment outlives the step that read it, whoever keeps the
    batch (``engine.state.batch`` until the engine goes). ``close()`` lets go of Grain's iterators and waits for
    Grain's unlinking thread, so a run that ends leaves no segment behind.
    """

    def __init__(self, it: Iterator[Any], identity: dict[str, Any]) -> None:
        super().__init__(it, _out_of_shared_memory)
        self._identity = identity
        if not _open:  # registered after Grain's and multiprocessing's own exit handlers: it runs before them
            atexit.unregister(_close_open)
            atexit.register(_close_open)
        _open.add(self)

    def close(self) -> None:
        super().close()
        self._it = iter(())  # the closed Grain iterators go now, not at the interpreter's exit
        _open.discard(self)
        _wait_for_unlinking()

    def get_state(self) -> dict[str, Any]:
        return {"grain": super().get_state(), "pipeline": self._identity}

    def set_state(self, state: Any) -> None:
        saved = state.get("pipeline") if isinstance(state, dict) else None
        if not isinstance(saved, dict) or "grain" not in state:
            raise ValueError(f"The saved position is not a GrainPipeline's: {state!r:.200}.")
        if saved != self._identity:
            differs = ", ".join(
                f"{k} {saved.get(k)!r} (now {v!r})" for k, v in self._identity.items() if saved.get(k) != v
            )
            raise ValueError(
                f"The saved position is for another pipeline: {differs}. Resume with the data the run was saved "
                "with, or start the run anew."
            )
        super().set_state(state["grain"])


class _Stream:
    """This process's examples of the endless stream of global batches, transformed: what Grain reads.

    Example ``i`` here is example ``j`` of this process's part of global batch ``t`` (``t, j = divmod(i, part)``):
    record ``order(e)[b * batch_size + shard_index * part + j]`` for pass ``e`` and batch ``b`` of it, so the batches
    are [`ArrayDataset`][ember.data.ArrayDataset]'s, split as its ``shard`` splits them.
    """

    def __init__(
        self,
        source: Any,
        batch_size: int,
        shard: tuple[int, int],
        shuffle: bool,
        seed: int,
        transforms: list[tuple[str, Any]],
    ) -> None:
        self.source, self.batch_size, self.shuffle, self.seed = source, batch_size, shuffle, seed
        self.shard_index, count = shard
        self.part = batch_size // count
        self.per_pass = len(source) // batch_size
        self.transforms = transforms
        self._order: tuple[int, np.ndarray] | None = None  # the latest pass's permutation
        self._local: threading.local | None = None
        self._first: tuple[int, Any] | None = None  # the first example's record and its structure, shapes, dtypes

    def __len__(self) -> int:
        return sys.maxsize  # endless, as Grain's own repeat()

    def _place(self, index: int) -> tuple[int, int]:
        """``(record, place in the global stream)`` of this process's example ``index``."""
        t, j = divmod(index, self.part)
        place = t * self.batch_size + self.shard_index * self.part + j
        e, at = divmod(place, self.per_pass * self.batch_size)
        if not self.shuffle:
            return at, place
        order = self._order
        if order is None or order[0] != e:
            order = self._order = (e, np.random.default_rng([self.seed, e]).permutation(len(self.source)))
        return int(order[1][at]), place

    def __getitem__(self, index: int) -> Any:
        return self._getitems([index])[0]

    def _getitems(self, indices: Sequence[int]) -> list[Any]:
        """The examples at ``indices``, read in one call where the source can (Grain's batched read)."""
        places = [self._place(i) for i in indices]
        records = [r for r, _ in places]
        try:
            read = getattr(self.source, "_getitems", None)
            # the ignore below: a source is indexable by the protocol Grain reads it by
            examples: list[Any] = [*read(records)] if callable(read) else [self.source[r] for r in records]  # type: ignore[misc]
        except Exception:
            examples = [self._one(r) for r in records]  # find the record at fault
        return [self._transformed(ex, record, place) for ex, (record, place) in zip(examples, places, strict=True)]

    def _one(self, record: int) -> Any:
        try:
            return self.source[record]
        except RecordError:
            raise
        except Exception as e:
            raise RecordError(f"record {record} of {self.source!r:.200} failed: {e!r}", index=record) from e

    def _transformed(self, example: Any, record: int, place: int) -> Any:
        try:
            for kind, fn in self.transforms:
                example = fn(example, self._rng(place)) if kind == "random" else fn(example)
        except Exception as e:
            raise RecordError(f"record {record} of {self.source!r:.200} failed: {e!r}", index=record) from e
        self._check_like_the_first(example, record)
        return example

    def _check_like_the_first(self, example: Any, record: int) -> None:
        """Raise `RecordError` naming ``record`` when its example's structure, shapes or dtypes differ from the first.

        Grain stacks the examples of a batch, and says only that they differ; this says which record, and how.
        """
        leaves, treedef = jax.tree.flatten(example)
        spec = (treedef, [(np.shape(x), np.result_type(x).name) for x in leaves])
        first = self._first
        if first is None:
            self._first = (record, spec)
            return
        if spec != first[1]:
            raise RecordError(
                f"record {record} of {self.source!r:.200} gives {_described(*spec)} after its transforms, where record "
                f"{first[0]} gave {_described(*first[1])}: every example must have one structure, shapes and dtypes "
                "(a batch stacks them).",
                index=record,
            )

    def _rng(self, place: int) -> np.random.Generator:
        """Philox keyed by ``seed``, its counter at ``place``: Grain's way, one generator reset per example."""
        local = self._local
        if local is None:
            local = self._local = threading.local()  # Grain reads from several threads
        if not hasattr(local, "generator"):
            local.bits = np.random.Philox(key=self.seed)
            local.start = local.bits.state
            local.generator = np.random.Generator(local.bits)
        local.start["state"]["counter"][3] = place
        local.bits.state = local.start
        return local.generator

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_order": None, "_local": None, "_first": None}  # each process builds its own

    def __repr__(self) -> str:
        return f"examples of {self.source!r:.200}"


def _described(treedef: Any, leaves: list[tuple[tuple[int, ...], str]]) -> str:
    shown = ", ".join(f"{dtype}{list(shape)}" for shape, dtype in leaves)
    return f"{treedef} with leaves [{shown}]"


def _transform(t: Any, name: str) -> tuple[str, Any]:
    if callable(getattr(t, "random_map", None)):
        return "random", t.random_map
    if callable(getattr(t, "map", None)):
        return "map", t.map
    if callable(t):
        return "map", t
    raise TypeError(f"`{name}` must be a callable, grain.transforms.Map or RandomMap; got {type(t).__name__}.")


_open: weakref.WeakSet[_Position] = weakref.WeakSet()  # pipeline iterators not closed yet


def _close_open() -> None:
    """At the interpreter's exit, close the pipeline iterators nobody closed (a loop left early), while Grain can."""
    for position in list(_open):
        with contextlib.suppress(Exception):
            position.close()


def _out_of_shared_memory(batch: Any) -> Any:
    """``batch`` with each array that lives in a shared-memory segment copied into memory of its own."""
    return jax.tree.map(lambda x: np.array(x) if isinstance(x.base, mmap.mmap) else x, batch)


#: Seconds `close` waits for Grain's thread that unlinks the shared memory of dropped batches.
UNLINK_WAIT = 10.0


def _wait_for_unlinking() -> None:
    """Wait until Grain's thread has unlinked the segments of the batches dropped so far (Grain 0.2.18's pool).

    Grain unlinks a batch's shared memory on a thread of its own once the array is collected; a process that ends
    right after closing its iterator would leave the last few behind (``resource_tracker: There appear to be N leaked
    shared_memory objects``). A task queued behind them on that one thread runs once they are done.
    """
    from grain._src.python.ipc import shared_memory_array  # no public name for the pool in grain 0.2.18

    pool = getattr(shared_memory_array.SharedMemoryArray, "_del_thread_pool", None)
    if pool is not None:
        gc.collect()  # batches in reference cycles are dropped now, their segments queued
        with contextlib.suppress(Exception):  # a pool already closed at the interpreter's exit: nothing to wait for
            pool.apply_async(int).wait(UNLINK_WAIT)


#: Seconds between a Grain worker's checks that the process that started it is still there.
PARENT_CHECK_EVERY = 0.5


def exit_with_parent(worker_index: int, worker_count: int) -> None:
    """A Grain worker initialiser: end this worker within `PARENT_CHECK_EVERY` seconds of its parent's death.

    A worker whose parent is killed (SIGKILL, the OOM killer) is re-parented and would live on, holding the parent's
    output pipes (a supervisor waiting for their end waits for ever) and Grain's shared memory. A daemon thread here
    checks the parent's process id and ends the worker when it changes. (``prctl(PR_SET_PDEATHSIG)`` fires when the
    *thread* that started the worker ends, and Grain starts workers from threads of a pool.)

    Examples:
        >>> from ember.data._grain import exit_with_parent
        >>> exit_with_parent(0, 2)  # in a worker: watches the parent from now on
    """
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(PARENT_CHECK_EVERY)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="ember-exit-with-parent", daemon=True).start()


def _accept_unparsed_flags() -> None:
    """Grain 0.2.18's workers read an absl flag, failing in scripts that never parse flags (google/grain#1355).

    Marking the flags parsed, as absl's own tests do, keeps every flag at its default; a program that
    parsed its flags (absl.app) is left alone.
    """
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
