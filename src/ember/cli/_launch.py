"""`ember launch -n N COMMAND ...`: N local processes of one command, as one ``jax.distributed`` run."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

from ember._multiprocess import REQUEUE_STATUS

#: Seconds the other processes get to end after one has failed (SIGTERM), before they are killed.
GRACE = 30.0


def free_port() -> int:
    """A TCP port on localhost that no one listens on now."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def process_environment(index: int, count: int, port: int) -> dict[str, str]:
    """What process ``index`` of ``count`` gets in its environment: where the coordinator is, and who it is.

    ``EMBER_COORDINATOR``, ``EMBER_NUM_PROCESSES`` and ``EMBER_PROCESS_ID`` (which ``ember train --distributed``
    reads), and ``JAX_COORDINATOR_ADDRESS`` (which ``jax.distributed.initialize`` reads).

    Examples:
        >>> from ember.cli._launch import process_environment
        >>> process_environment(1, 2, 12345)["EMBER_PROCESS_ID"]
        '1'
    """
    address = f"localhost:{port}"
    return {
        "EMBER_COORDINATOR": address,
        "EMBER_NUM_PROCESSES": str(count),
        "EMBER_PROCESS_ID": str(index),
        "JAX_COORDINATOR_ADDRESS": address,
    }


#: Run first in each process on Linux: ask to be killed when the launcher dies (a parent-death signal survives
#: ``exec``), then become the command. A shim, not ``preexec_fn``: that would fork the launcher, which warns, and can
#: deadlock, in a process that runs JAX.
_SHIM = (
    "import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
    "os.getppid() == int(sys.argv[1]) or os._exit(1); os.execvp(sys.argv[2], sys.argv[2:])"
)


def _with_the_launcher(command: Sequence[str]) -> list[str]:
    """``command``, started so that its process ends with the launcher's (Linux; elsewhere as it is)."""
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-c", _SHIM, str(os.getpid()), *command]


#: The runtime's own lines, not the run's: Gloo's connection notes, and absl's INFO and WARNING lines from C++
#: (``W1128 06:20:01.123456  1234 coordination_service.cc:123] ...``); its ERROR and FATAL lines are kept.
_RUNTIME_LINE = re.compile(r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks|[IW]\d{4} [\d:.]+ +\d+ [\w./-]+:\d+\] ")


def shown(line: str) -> bool:
    """Whether the launcher shows a line of a process's output: not a blank one, nor the runtime's own.

    Examples:
        >>> from ember.cli._launch import shown
        >>> shown("epoch   1  iteration    22"), shown("   "), shown("[Gloo] Rank 1 is connected to 1 peer ranks. ")
        (True, False, False)
        >>> shown("W1128 06:20:01.123456  4242 coordination_service.cc:1203] Use error polling to propagate errors")
        False
    """
    return bool(line.strip()) and _RUNTIME_LINE.match(line) is None


def _relay(pipe: IO[str], index: int, out: IO[str], lock: threading.Lock) -> None:
    """Copy ``pipe`` to ``out`` line by line, each line prefixed with ``[index]``; blank and runtime lines left out."""
    for line in pipe:
        if not shown(line):
            continue
        with lock:
            out.write(f"[{index}] {line}")
            out.flush()
    pipe.close()


def launch(
    count: int,
    command: Sequence[str],
    *,
    port: int | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    """Run ``count`` processes of ``command`` as one distributed run on this machine; return the run's exit status.

    Each process gets `process_environment`; its output comes out line by line, prefixed with ``[index]``, on the
    launcher's standard output and error, blank lines and the runtime's own notes left out (`shown`). SIGINT and
    SIGTERM sent to the launcher go to every process (each runs in a session of its own, so a Ctrl-C reaches it
    once). When a process ends with a non-zero status, the others get SIGTERM, then SIGKILL after `GRACE` seconds,
    and the launcher exits with that first status (128 + the signal for a process a signal the launcher passed on
    ended, as shells do). A process a signal of its own ended (SIGKILL, the OOM killer) was lost: the launcher says
    which and exits with `REQUEUE_STATUS` (75), as the survivors' ``ProcessWatchdog`` does, so a scheduler requeues
    whichever process died. A launcher that is killed takes its processes with it (Linux).

    Args:
        count: how many processes, at least 1.
        command: the program and its arguments (``["ember", "train", "--distributed"]``).
        port: the coordinator's port on localhost (a free one by default).
        stdout: where the processes' standard output goes (the launcher's by default).
        stderr: where their standard error goes (the launcher's by default).

    Examples:
        >>> import io, sys
        >>> from ember.cli._launch import launch
        >>> out = io.StringIO()
        >>> launch(2, [sys.executable, "-c", "import os; print(os.environ['EMBER_PROCESS_ID'])"], stdout=out)
        0
        >>> sorted(out.getvalue().splitlines())
        ['[0] 0', '[1] 1']
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"`count` (-n) must be a positive number of processes, got {count!r}.")
    if not command:
        raise ValueError("`command` is empty: name the program to run, as in `ember launch -n 2 -- ember train`.")
    out, err = stdout or sys.stdout, stderr or sys.stderr
    port = port or free_port()
    procs = []
    for index in range(count):
        env = {**os.environ, **process_environment(index, count, port)}
        procs.append(
            subprocess.Popen(
                _with_the_launcher(command),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,  # a Ctrl-C reaches each process once: forwarded by the launcher
            )
        )
    stopping: list[int] = []  # the signals the launcher was sent and passed on
    # before the relays start: a signal sent once a process's line (its "ready") is seen is noted, then passed on
    forwarded = _forward_signals(stopping)
    lock = threading.Lock()
    relays = [
        threading.Thread(target=_relay, args=(pipe, index, stream, lock), daemon=True)
        for index, proc in enumerate(procs)
        for pipe, stream in ((proc.stdout, out), (proc.stderr, err))
    ]
    try:
        for relay in relays:
            relay.start()
        status = _wait(procs, stopping, err)
    finally:
        for sig, previous in forwarded.items():
            signal.signal(sig, previous)
    for relay in relays:
        relay.join(timeout=10)
    return status


def _forward_signals(stopping: list[int]) -> dict[int, Any]:
    """Note SIGINT and SIGTERM in ``stopping`` for `_wait` to pass on; return the old handlers.

    The handler only notes the signal: passing it on (polling and signalling processes) is the main loop's, so no
    ``Popen`` method runs inside a signal handler, interleaved with the same call in the loop it interrupted.
    """

    def note(sig: int, _frame: Any) -> None:
        stopping.append(sig)

    if threading.current_thread() is not threading.main_thread():
        return {}  # only the main thread may set handlers (a test calling launch from another thread)
    return {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}


def _wait(procs: list[subprocess.Popen[str]], stopping: list[int], err: IO[str]) -> int:
    """Wait for every process; at the first failure end the others; return the run's exit status.

    The first non-zero status, as a shell reports it (128 + the signal for a process a signal ended), else 0; but a
    process ended by a signal the launcher did not pass on (SIGKILL, the OOM killer) was lost: the run exits with
    `REQUEUE_STATUS`, whichever process it was, and says which.
    """
    first = 0
    deadline: float | None = None
    passed = 0  # how many of ``stopping`` were passed on
    while any(proc.poll() is None for proc in procs):
        for sig in stopping[passed:]:
            passed += 1
            _signal_running(procs, sig)
        for index, proc in enumerate(procs):
            code = proc.poll()
            if code and not first:
                first = _run_status(index, code, stopping, err)
                deadline = time.monotonic() + GRACE
                _signal_running(procs, signal.SIGTERM)
        if deadline is not None and time.monotonic() > deadline:
            _signal_running(procs, signal.SIGKILL)
        time.sleep(0.05)
    if not first:
        first = next((_run_status(i, p.returncode, stopping, err) for i, p in enumerate(procs) if p.returncode), 0)
    return first


def _signal_running(procs: list[subprocess.Popen[str]], sig: int) -> None:
    """Send ``sig`` to every process of ``procs`` still running (one that ends meanwhile is passed over)."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)


def _run_status(index: int, code: int, stopping: list[int], err: IO[str]) -> int:
    """The run's exit status for process ``index`` ending first with ``code`` (negative: the signal that ended it)."""
    if code > 0:
        return code
    if -code in stopping:  # the launcher was told to stop, and passed it on
        return 128 - code
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    print(
        f"ember launch: process {index} was lost ({name}); the others were stopped. Exit {REQUEUE_STATUS}: run the "
        "same command again to resume from the last checkpoint.",
        file=err,
        flush=True,
    )
    return REQUEUE_STATUS
