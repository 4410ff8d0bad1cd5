"""`ember launch -n N COMMAND ...`: N local processes of one command, as one ``jax.distributed`` run."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Any, NamedTuple

from ember._ledger_file import RESTART_VARIABLE
from ember._multiprocess import REQUEUE_STATUS

#: Seconds the other processes get to end after one has failed (SIGTERM), before they are killed.
GRACE = 30.0

#: The exit statuses of a run that resumes when launched again: 75 (a process lost, `REQUEUE_STATUS`) and 143
#: (SIGTERM: preempted). ``ember launch --max-restarts`` relaunches on these by default.
RESUMABLE = (REQUEUE_STATUS, 128 + signal.SIGTERM)


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


def restart_environment(number: int, of: int, cause: str, failed_at: float) -> dict[str, str]:
    """What each process of restart ``number`` (of ``of`` allowed) gets in its environment: the restart, as JSON.

    ``cause`` says what ended the launch before (``"process 1 was lost (SIGKILL)"``), ``failed_at`` when the launcher
    saw it (``time.time()``). `GoodputLedger` puts it in the relaunched run's record, and ``ember goodput`` shows it.

    Examples:
        >>> from ember.cli._launch import restart_environment
        >>> restart_environment(1, 2, "process 1 ended with status 75", 1700000000.0)["EMBER_RESTART"]
        '{"number": 1, "of": 2, "cause": "process 1 ended with status 75", "failed_at": 1700000000.0}'
    """
    return {RESTART_VARIABLE: json.dumps({"number": number, "of": of, "cause": cause, "failed_at": failed_at})}


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
    max_restarts: int = 0,
    restart_on: Sequence[int] = RESUMABLE,
    backoff: float = 0.0,
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

    With ``max_restarts``, a launch that ends with a status of ``restart_on`` is launched again, every process, after
    ``backoff`` seconds, up to ``max_restarts`` times: each relaunch resumes from the run's last checkpoint, as one
    by hand does, its processes told which restart they are (`restart_environment`). Each restart is one line on
    the launcher's standard error; once they are spent, a summary line, and the last status. Any other status ends
    the launch at once; so does a signal to the launcher (passed on, never restarted, even during the backoff).

    Args:
        count: how many processes, at least 1.
        command: the program and its arguments (``["ember", "train", "--distributed"]``).
        port: the coordinator's port on localhost (a free one by default, a new one for each restart).
        stdout: where the processes' standard output goes (the launcher's by default).
        stderr: where their standard error goes, and the launcher's own lines (the launcher's by default).
        max_restarts: how many times a launch that ended resumable is launched again (``--max-restarts``; 0: never).
        restart_on: the exit statuses that are relaunched (``--restart-on``; `RESUMABLE` by default).
        backoff: seconds between a launch's end and its restart (``--backoff``).

    Examples:
        >>> import io, sys
        >>> from ember.cli._launch import launch
        >>> out = io.StringIO()
        >>> launch(2, [sys.executable, "-c", "import os; print(os.environ['EMBER_PROCESS_ID'])"], stdout=out)
        0
        >>> sorted(out.getvalue().splitlines())
        ['[0] 0', '[1] 1']
        >>> err = io.StringIO()
        >>> launch(1, [sys.executable, "-c", "raise SystemExit(75)"], stderr=err, max_restarts=1)
        75
        >>> print(err.getvalue().rstrip())  # doctest: +NORMALIZE_WHITESPACE
        ember launch: process 0 ended with status 75; restart 1 of 1.
        ember launch: 1 restart spent; the launches ended: process 0 ended with status 75; process 0 ended with
        status 75. Exit 75: run the same command again to resume from the last checkpoint.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"`count` (-n) must be a positive number of processes, got {count!r}.")
    if not command:
        raise ValueError("`command` is empty: name the program to run, as in `ember launch -n 2 -- ember train`.")
    _check_restarts(max_restarts, restart_on, backoff)
    out, err = stdout or sys.stdout, stderr or sys.stderr
    stopping: list[int] = []  # the signals the launcher was sent and passed on
    # before the relays start: a signal sent once a process's line (its "ready") is seen is noted, then passed on
    forwarded = _forward_signals(stopping)
    causes: list[str] = []
    try:
        restart: dict[str, str] = {}
        while True:
            end = _launch_once(count, command, port or free_port(), (out, err), stopping, restart)
            if not end.status or stopping or end.status not in restart_on or len(causes) == max_restarts:
                break
            causes.append(end.cause)
            wait = f" in {backoff:g} s" if backoff else ""
            _say(err, f"{end.cause}; restart {len(causes)} of {max_restarts}{wait}.")
            if _stopped_within(backoff, stopping):
                _say(err, f"stopped before restart {len(causes)}; run the same command again to resume.")
                return 128 + stopping[0]
            restart = restart_environment(len(causes), max_restarts, end.cause, end.when)
    finally:
        for sig, previous in forwarded.items():
            signal.signal(sig, previous)
    again = f"Exit {end.status}: run the same command again to resume from the last checkpoint."
    if causes and end.status in restart_on and not stopping:  # the restarts are spent
        spent = f"{len(causes)} restart{'s' if len(causes) > 1 else ''} spent"
        _say(err, f"{spent}; the launches ended: {'; '.join([*causes, end.cause])}. {again}")
    elif end.lost:
        _say(err, f"{end.cause}; the others were stopped. {again}")
    return end.status


def _check_restarts(max_restarts: int, restart_on: Sequence[int], backoff: float) -> None:
    """Refuse a restart setting that is not one, naming the option and the value."""
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"`max_restarts` (--max-restarts) must be a number of restarts >= 0, got {max_restarts!r}.")
    if isinstance(restart_on, str | bytes) or not all(
        isinstance(s, int) and not isinstance(s, bool) and 0 < s < 256 for s in restart_on
    ):
        raise ValueError(f"`restart_on` (--restart-on) must be exit statuses from 1 to 255, got {restart_on!r}.")
    if isinstance(backoff, bool) or not isinstance(backoff, int | float) or not 0 <= backoff < float("inf"):
        raise ValueError(f"`backoff` (--backoff) must be a number of seconds >= 0, got {backoff!r}.")


def statuses(text: str) -> tuple[int, ...]:
    """The exit statuses of ``--restart-on``: numbers separated by commas (an ``argparse`` type).

    Examples:
        >>> from ember.cli._launch import statuses
        >>> statuses("75,143")
        (75, 143)
    """
    try:
        found = tuple(int(part) for part in text.split(","))
    except ValueError:
        found = ()
    if not found or not all(0 < s < 256 for s in found):
        raise argparse.ArgumentTypeError(f"expected exit statuses from 1 to 255 separated by commas, got {text!r}")
    return found


def _say(err: IO[str], line: str) -> None:
    print(f"ember launch: {line}", file=err, flush=True)


def _stopped_within(seconds: float, stopping: list[int]) -> bool:
    """Wait ``seconds``, or less when the launcher is sent a signal meanwhile; whether it was."""
    deadline = time.monotonic() + seconds
    while not stopping and time.monotonic() < deadline:
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    return bool(stopping)


class _End(NamedTuple):
    """How one launch ended: its status, which process ended it and how (in words), when; whether it was lost."""

    status: int
    cause: str
    when: float
    lost: bool


def _launch_once(
    count: int,
    command: Sequence[str],
    port: int,
    streams: tuple[IO[str], IO[str]],
    stopping: list[int],
    restart: dict[str, str],
) -> _End:
    """Start ``count`` processes of ``command``, relay their output, wait for them all; how the launch ended."""
    procs = []
    for index in range(count):
        env = {**os.environ, **process_environment(index, count, port), **restart}
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
    lock = threading.Lock()
    relays = [
        threading.Thread(target=_relay, args=(pipe, index, stream, lock), daemon=True)
        for index, proc in enumerate(procs)
        for pipe, stream in zip((proc.stdout, proc.stderr), streams, strict=True)
    ]
    for relay in relays:
        relay.start()
    end = _wait(procs, stopping)
    for relay in relays:
        relay.join(timeout=10)
    return end


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


def _wait(procs: list[subprocess.Popen[str]], stopping: list[int]) -> _End:
    """Wait for every process; at the first failure end the others; how the launch ended.

    The first non-zero status, as a shell reports it (128 + the signal for a process a signal the launcher passed on
    ended), else 0; but a process ended by a signal the launcher did not pass on (SIGKILL, the OOM killer) was lost:
    the launch ends with `REQUEUE_STATUS`, whichever process it was.
    """
    first: _End | None = None
    deadline: float | None = None
    passed = 0  # how many of ``stopping`` were passed on
    while any(proc.poll() is None for proc in procs):
        for sig in stopping[passed:]:
            passed += 1
            _signal_running(procs, sig)
        for index, proc in enumerate(procs):
            code = proc.poll()
            if code and first is None:
                first = _ended(index, code, stopping)
                deadline = time.monotonic() + GRACE
                _signal_running(procs, signal.SIGTERM)
        if deadline is not None and time.monotonic() > deadline:
            _signal_running(procs, signal.SIGKILL)
        time.sleep(0.05)
    if first is None:
        failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode]
        first = _ended(*failed[0], stopping) if failed else _End(0, "every process ended with status 0", 0.0, False)
    return first


def _signal_running(procs: list[subprocess.Popen[str]], sig: int) -> None:
    """Send ``sig`` to every process of ``procs`` still running (one that ends meanwhile is passed over).

    Then SIGCONT: a stopped process (SIGSTOP, a debugger, a stalled machine) acts on the signal now, not after
    the grace, when it would be killed.
    """
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
                proc.send_signal(signal.SIGCONT)


def _ended(index: int, code: int, stopping: list[int]) -> _End:
    """How a launch ends when process ``index`` ends first with ``code`` (negative: the signal that ended it)."""
    now = time.time()
    if code > 0:
        return _End(code, f"process {index} ended with status {code}", now, False)
    if -code in stopping:  # the launcher was told to stop, and passed it on
        return _End(128 - code, f"process {index} ended by the {signal.Signals(-code).name} passed on", now, False)
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return _End(REQUEUE_STATUS, f"process {index} was lost ({name})", now, True)
