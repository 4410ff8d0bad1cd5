"""`ember train --distributed`: starting the processes of a run together, and ending them together."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

from ember.errors import ProcessesMissing

#: Seconds without a heartbeat after which the coordination service declares a process lost (``ember train
#: --distributed``; ``EMBER_HEARTBEAT_TIMEOUT`` overrides it).
HEARTBEAT_TIMEOUT = 30


def start_distributed(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Call ``jax.distributed.initialize`` for ``ember train --distributed``; return the arguments passed.

    With ``EMBER_COORDINATOR`` (host:port), ``EMBER_NUM_PROCESSES`` and ``EMBER_PROCESS_ID`` set in the
    environment they are passed explicitly; without them, JAX detects the cluster (Slurm, Open MPI, TPU). JAX's
    recoverability is turned on first, so that when a process is lost the others are not aborted by the runtime
    but end through the ``ProcessWatchdog`` ``ember train`` attaches, naming the checkpoint to resume from; they do
    within about ``EMBER_HEARTBEAT_TIMEOUT`` seconds (the coordination service's heartbeat timeout,
    ``HEARTBEAT_TIMEOUT`` by default; JAX's own is 100).

    Examples:
        >>> from unittest import mock
        >>> from ember.cli._distributed import start_distributed
        >>> env = {"EMBER_COORDINATOR": "node0:1234", "EMBER_NUM_PROCESSES": "2", "EMBER_PROCESS_ID": "1"}
        >>> with mock.patch("jax.distributed.initialize"), mock.patch("jax.config.update"):
        ...     start_distributed(env)
        {'coordinator_address': 'node0:1234', 'num_processes': 2, 'process_id': 1}
    """
    import jax

    from ember._multiprocess import wait_timeout

    env = os.environ if environ is None else environ
    names = ("EMBER_COORDINATOR", "EMBER_NUM_PROCESSES", "EMBER_PROCESS_ID")
    given = [n for n in names if n in env]
    if given and len(given) != len(names):
        missing = [n for n in names if n not in env]
        raise ValueError(f"--distributed got {given} from the environment but not {missing}; set all three or none.")
    kwargs: dict[str, Any] = {}
    if given:
        try:
            kwargs = {
                "coordinator_address": env["EMBER_COORDINATOR"],
                "num_processes": int(env["EMBER_NUM_PROCESSES"]),
                "process_id": int(env["EMBER_PROCESS_ID"]),
            }
        except ValueError:
            raise ValueError(
                "EMBER_NUM_PROCESSES and EMBER_PROCESS_ID must be ints, got "
                f"{env['EMBER_NUM_PROCESSES']!r} and {env['EMBER_PROCESS_ID']!r}."
            ) from None
    heartbeat = heartbeat_timeout(env)
    wait_timeout(env)  # a bad EMBER_WAIT_TIMEOUT is said now, not at the run's first checkpoint
    jax.config.update("jax_enable_recoverability", True)
    jax.distributed.initialize(**kwargs, heartbeat_timeout_seconds=heartbeat)
    return kwargs


def heartbeat_timeout(environ: Mapping[str, str] | None = None) -> int:
    """The coordination service's heartbeat timeout for ``ember train --distributed``, in seconds.

    ``EMBER_HEARTBEAT_TIMEOUT``, or `HEARTBEAT_TIMEOUT`: a process silent that long (killed, or stalled: SIGSTOP,
    swapped out) is declared lost, and the others end with status 75 naming it. Their watchdog gives the service on
    process 0 half of it to answer before they name process 0 (the runtime would end them at about 0.85 of it).

    Examples:
        >>> from ember.cli._distributed import heartbeat_timeout
        >>> heartbeat_timeout({}), heartbeat_timeout({"EMBER_HEARTBEAT_TIMEOUT": "15"})
        (30, 15)
    """
    env = os.environ if environ is None else environ
    heartbeat = env.get("EMBER_HEARTBEAT_TIMEOUT", str(HEARTBEAT_TIMEOUT))
    if not heartbeat.isdigit() or int(heartbeat) < 1:
        raise ValueError(f"EMBER_HEARTBEAT_TIMEOUT must be a positive number of seconds, got {heartbeat!r}.")
    return int(heartbeat)


#: Where a process finds its index before ``jax.distributed`` starts: ember's launcher, Slurm, Open MPI.
_PROCESS_INDEX = ("EMBER_PROCESS_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")


def first_process(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is the run's first (process 0), from its environment, before ``jax.distributed`` starts.

    Read from ``EMBER_PROCESS_ID`` (``ember launch``), ``SLURM_PROCID`` or ``OMPI_COMM_WORLD_RANK``; without any,
    ``True`` (a process alone). ``ember train --distributed`` answers a finished run with it: every process ends at
    once, process 0 says why.

    Examples:
        >>> from ember.cli._distributed import first_process
        >>> first_process({"EMBER_PROCESS_ID": "1"}), first_process({"SLURM_PROCID": "0"}), first_process({})
        (False, True, True)
    """
    env = os.environ if environ is None else environ
    return next((env[name].strip() == "0" for name in _PROCESS_INDEX if name in env), True)


def end_together(status: int = 0) -> None:
    """End every process of the run together, once all have finished it, with ``status``; in one process, return.

    With JAX's recoverability on, the runtime no longer holds the processes together at exit, and its shutdown
    races with the CPU collectives' own calls to the coordination service (process 0 was seen aborting there). So
    each process waits for the others through the coordination service (at most ``EMBER_WAIT_TIMEOUT`` seconds:
    `missing_processes` ends it naming those that did not come), flushes its output, and ends without the runtime's
    shutdown call; process 0, which hosts the service, ends last.

    Examples:
        >>> from ember.cli._distributed import end_together
        >>> end_together()  # one process: returns at once
    """
    import time

    import jax

    from ember._multiprocess import coordination_client, exchange

    if coordination_client() is None:
        return
    try:
        exchange("ember: end of the run", str(status))
    except ProcessesMissing as e:
        missing_processes(e)
    sys.stdout.flush()
    sys.stderr.flush()
    if jax.process_index() == 0:
        time.sleep(1.0)  # the others are gone before the service is
    os._exit(status)


def missing_processes(error: ProcessesMissing) -> NoReturn:
    """End this process with status 75 (relaunch every process), naming the processes ``error`` says did not come.

    Examples:
        >>> from unittest import mock
        >>> from ember.errors import ProcessesMissing
        >>> from ember.cli._distributed import missing_processes
        >>> with mock.patch("os._exit", side_effect=SystemExit) as ended, mock.patch("sys.stderr", sys.stdout):
        ...     missing_processes(ProcessesMissing([1], "ember: end of the run", 5.0))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        SystemExit
        >>> ended.call_args.args
        (75,)
    """
    import jax

    from ember._multiprocess import REQUEUE_STATUS

    sys.stderr.write(  # one write: a traceback printed meanwhile stays off its line
        f"ember: {error}. Process {jax.process_index()} stops here with exit status {REQUEUE_STATUS}: relaunch every "
        "process; the run resumes from its last complete checkpoint.\n"
    )
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(REQUEUE_STATUS)
