"""What the processes of a multi-process run decide together: one answer from all, and values traded between them.

Two mechanisms, for two situations:

- [`any_process`][ember._multiprocess.any_process] and [`gather_text`][ember._multiprocess.gather_text] are device
  collectives: every process calls them at the same point of the training thread (a handler deciding to stop or
  save, a checkpoint taking the metrics' state dicts).
- [`exchange`][ember._multiprocess.exchange] goes through JAX's coordination service (a key-value store the
  processes share since ``jax.distributed.initialize``), so it works from any thread, a checkpoint's writer thread
  included, and carries text of any length (a list of files and their checksums).

In a single process both are plain local answers and import nothing but JAX.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ember.errors import ProcessesMissing

#: The exit status of a multi-process run that lost a process: EX_TEMPFAIL, "try again" (relaunch every process and
#: the run resumes from its last checkpoint). `ProcessWatchdog` ends the survivors with it; `ember launch` exits
#: with it whichever process was lost.
REQUEUE_STATUS = 75

#: How long the processes wait for each other where they meet outside the compiled step (a checkpoint's commit, the
#: run's end), in seconds, unless ``EMBER_WAIT_TIMEOUT`` says otherwise: room for a slow shared file system.
WAIT_TIMEOUT = 1800.0


def wait_timeout(environ: Mapping[str, str] | None = None) -> float:
    """Seconds the processes wait for each other where they meet outside the compiled step: ``EMBER_WAIT_TIMEOUT``.

    `WAIT_TIMEOUT` (1800) by default: a checkpoint's commit waits for the slowest process's write. A process that
    stops (killed, SIGSTOP) is named sooner, by the coordination service's heartbeat timeout; this bounds the wait
    for one that is alive but stuck.

    Examples:
        >>> from ember._multiprocess import wait_timeout
        >>> wait_timeout({}), wait_timeout({"EMBER_WAIT_TIMEOUT": "90"})
        (1800.0, 90.0)
        >>> wait_timeout({"EMBER_WAIT_TIMEOUT": "0"})
        Traceback (most recent call last):
        ...
        ValueError: EMBER_WAIT_TIMEOUT must be a positive number of seconds, got '0'.
    """
    given = (os.environ if environ is None else environ).get("EMBER_WAIT_TIMEOUT")
    if given is None:
        return WAIT_TIMEOUT
    try:
        seconds = float(given)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"EMBER_WAIT_TIMEOUT must be a positive number of seconds, got {given!r}.")
    return seconds


def any_process(flag: bool) -> bool:
    """Whether ``flag`` is true on any process: the same answer on every process.

    In a multi-process run this is a collective, so every process must call it at the same point; in a
    single process it is a plain ``bool``.

    Handlers whose decision changes control flow (stop, save) use it, so no process skips a collective
    the others enter.

    Examples:
        >>> from ember._multiprocess import any_process
        >>> any_process(False), any_process(True)
        (False, True)
    """
    import jax

    if jax.process_count() == 1:
        return bool(flag)
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(np.asarray(flag, np.bool_))).any())


def gather_text(text: str) -> list[str]:
    """Every process's ``text``, by process index: a collective over the devices, for text of any length.

    Every process must call it at the same point (as they take a checkpoint's state dicts together). Unlike
    [`exchange`][ember._multiprocess.exchange] it moves megabytes as easily as bytes, but only from the thread that runs
    the processes' collectives.

    Examples:
        >>> from ember._multiprocess import gather_text
        >>> gather_text("mine")
        ['mine']
    """
    import jax

    if jax.process_count() == 1:
        return [text]
    from jax.experimental import multihost_utils

    data = np.frombuffer(text.encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray(len(data), np.int32))).ravel()
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: len(data)] = data
    everyone = np.asarray(multihost_utils.process_allgather(padded))
    return [bytes(everyone[p, : int(n)]).decode() for p, n in enumerate(sizes)]


def coordination_client() -> Any:
    """JAX's coordination-service client in a multi-process run, else ``None``.

    Examples:
        >>> from ember._multiprocess import coordination_client
        >>> coordination_client() is None  # one process
        True
    """
    import jax

    if jax.process_count() == 1:
        return None
    from jax._src import distributed  # the key-value store and live-process queries have no public name in jax 0.10

    return distributed.global_state.client


_rounds: dict[str, int] = {}  # the next round of each name, in this process
_published: dict[str, list[str]] = {}  # this process's keys of each name not yet deleted, oldest first


def exchange(name: str, value: str, *, timeout: float | None = None) -> list[str]:
    """Publish ``value`` under ``name`` and return every process's value for it, by process index.

    Every call with the same ``name`` is a new round: every process must make the same calls with that name in the
    same order (as they save the same checkpoints into one folder; a name holding the folder's path keeps two folders'
    rounds apart). It waits at most ``timeout`` seconds in all (`wait_timeout` by default) for the other processes.
    A process deletes its own key of a round once every process has published a later round of that name (so has
    read it), and a long run does not fill the coordination service.

    Raises:
        ProcessesMissing: processes did not publish their value in time (stalled, stuck or lost): it names them all.

    Examples:
        >>> from ember._multiprocess import exchange
        >>> exchange("hello", "from process 0")  # one process: its own value
        ['from process 0']
    """
    client = coordination_client()
    if client is None:
        return [value]
    import jax

    timeout = wait_timeout() if timeout is None else timeout
    deadline = time.monotonic() + timeout
    n = _rounds.get(name, 0)
    _rounds[name] = n + 1
    key = f"ember/{name}/{n}"
    mine = f"{key}/{jax.process_index()}"
    client.key_value_set(mine, value)
    values: list[str] = []
    missing: list[int] = []
    for p in range(jax.process_count()):
        left = max(0.001, deadline - time.monotonic())  # past the deadline: only whether it is there now
        try:
            values.append(client.blocking_key_value_get(f"{key}/{p}", int(left * 1000)))
        except Exception:  # the runtime's error for a deadline: DEADLINE_EXCEEDED
            missing.append(p)
    if missing:
        raise ProcessesMissing(missing, name, timeout)
    published = _published.setdefault(name, [])
    published.append(mine)
    while len(published) > 2:  # every process has published the round after it, so has read it
        client.key_value_delete(published.pop(0))
    return values
