"""Who writes a folder now: one live launch of a run (or one watcher of a name) at a time, in ``held-by.json``.

[`hold`][ember._run_holder.hold] takes a folder for this launch before anything is written there, and gives it back
when the launch ends. The file names the holder (host, process id, since when) and is rewritten every `BEAT`
seconds with a new beat. A second launch is refused with [`RunHeldError`][ember.errors.RunHeldError] naming the
holder; a holder that is gone never blocks a relaunch:

- on the same machine (and PID namespace), a holder whose process is dead (SIGKILL, a crash) is taken over at once;
- from another machine, whose processes cannot be seen, a holder is watched for `SILENCE` seconds: if its beat does
  not move (the machine was lost), it is taken over; if it moves, the launch is refused.

A holder that was taken over while it was silent (stopped, frozen for longer than the silence) finds at its next beat
that the file names another launch, says so in one line and exits with status 75 without writing more.

The decision is made under an ``flock`` of the folder where the file system has one (local disks, NFSv4), so two
launches started at the same moment never both take it. In a multi-process run process 0 holds the folder for all,
and every process gets the same answer.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

from ember._atomic_file import replace_file, running
from ember._multiprocess import REQUEUE_STATUS, exchange
from ember.errors import RunHeldError

#: The file in a held folder that names its holder.
FILENAME = "held-by.json"

#: Seconds between a holder's beats.
BEAT = 5.0

#: Seconds a launch watches the beat of a holder it cannot see (another machine) before it takes a silent one's place;
#: ``EMBER_HOLD_SILENCE`` in the environment sets another.
SILENCE = 30.0

#: Seconds a launch waits for another's decision under the folder's ``flock`` before deciding without it.
_GUARD_WAIT = 10.0


class Holder:
    """This launch's hold on a folder: its beats go on until [`release`][ember._run_holder.Holder.release].

    Examples:
        >>> import json, tempfile
        >>> from pathlib import Path
        >>> from ember._run_holder import hold
        >>> folder = Path(tempfile.mkdtemp())
        >>> with hold(folder, "run") as holder:
        ...     sorted(json.loads((folder / "held-by.json").read_text()))
        ['beat', 'host', 'pid', 'pid_namespace', 'since', 'started', 'token']
        >>> (folder / "held-by.json").exists()
        False
    """

    def __init__(self, folder: Path, record: dict[str, Any], *, beat: float | None, made: bool = False) -> None:
        self.folder, self.record, self._made = folder, record, made
        self._stop = threading.Event()
        self._thread = None  # no beats: another process than 0 of a multi-process run, which process 0 holds for
        if beat is not None:
            self._thread = threading.Thread(target=self._beat, args=(beat,), name="ember-held-by", daemon=True)
            self._thread.start()

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every):
            with _guard(self.folder):
                found = _read(self.folder)
                if isinstance(found, dict) and found.get("token") != self.record["token"] and not self._stop.is_set():
                    _fenced(self.folder, found)
                self.record["beat"] += 1
                with contextlib.suppress(OSError):  # a full disk: this beat is missed, the next one tries again
                    _write(self.folder, self.record)

    def release(self) -> None:
        """Stop beating; remove ``held-by.json`` if it still names this launch, and the folder if it made it empty."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        with _guard(self.folder):
            found = _read(self.folder)
            if isinstance(found, dict) and found.get("token") == self.record["token"]:
                (self.folder / FILENAME).unlink(missing_ok=True)
        if self._made:  # a launch that failed before writing anything leaves no folder behind
            with contextlib.suppress(OSError):
                self.folder.rmdir()

    def __enter__(self) -> Holder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def hold(
    folder: str | os.PathLike[str],
    what: str,
    *,
    silence: float | None = None,
    beat: float = BEAT,
    say: Callable[[str], object] | None = None,
) -> Holder:
    """Take ``folder`` for this launch (process 0's, for all processes); raise ``RunHeldError`` if a live one holds it.

    Args:
        folder: the folder (made if missing).
        what: what holds it, as the refusal says it: ``"run"``, ``"watcher 'watch'"``.
        silence: seconds to watch the beat of a holder on another machine before taking its place (default:
            ``EMBER_HOLD_SILENCE``, else `SILENCE`).
        beat: seconds between this holder's beats.
        say: where the line "waiting for a silent holder" goes (default: standard error).

    Examples:
        >>> import tempfile
        >>> from ember._run_holder import hold
        >>> from ember.errors import RunHeldError
        >>> folder = tempfile.mkdtemp()
        >>> first = hold(folder, "run")
        >>> try:
        ...     hold(folder, "run")
        ... except RunHeldError as e:
        ...     print(str(e).split(": ")[0].endswith("held by another launch of this run"))
        True
        >>> first.release()
    """
    root = Path(folder)
    quiet = _silence(silence)
    for label, value in (("silence", quiet), ("beat", beat)):
        if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
            raise ValueError(f"`{label}` must be a positive number of seconds, got {value!r}.")
    me = {**_process(), "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "token": uuid.uuid4().hex, "beat": 0}
    import jax

    problem, made = None, not root.exists()
    if jax.process_index() == 0:
        root.mkdir(parents=True, exist_ok=True)
        try:
            _take(root, me, what, quiet, say or _to_stderr)
        except RunHeldError as e:
            problem = str(e)
    if jax.process_count() > 1:
        problem = json.loads(exchange(f"held-by:{root.resolve()}", json.dumps(problem))[0])
    if problem is not None:
        raise RunHeldError(problem)
    return Holder(root, me, beat=beat if jax.process_index() == 0 else None, made=made)


def _take(root: Path, me: dict[str, Any], what: str, silence: float, say: Callable[[str], object]) -> None:
    """Write ``me`` as ``root``'s holder once no live launch holds it; else raise ``RunHeldError``."""
    watched: tuple[Any, float] | None = None  # the record of a holder that cannot be seen, and since when
    while True:
        with _guard(root):
            found = _read(root)
            alive = _alive(found) if isinstance(found, dict) else None
            if found is None or alive is False:
                _write(root, me)
                return
            if alive:
                raise RunHeldError(_refusal(root, found, what))
            now = time.monotonic()
            if watched is None:
                watched = (found, now)
                say(
                    f"ember: {_holder_text(found)} holds {root} from where it cannot be seen; waiting up to "
                    f"{silence:g} s for its beat before taking its place."
                )
            elif found != watched[0]:
                if isinstance(found, dict):  # it beats: alive, elsewhere
                    raise RunHeldError(_refusal(root, found, what))
                watched = (found, now)
            elif now - watched[1] >= silence:
                _write(root, me)
                return
        time.sleep(min(1.0, silence / 10))


def _refusal(root: Path, found: Any, what: str) -> str:
    record = found if isinstance(found, dict) else {}
    return (
        f"{root} is held by another launch of this {what}: {_holder_text(found)}, since {record.get('since')} "
        f"({FILENAME}). Wait for it to end, or stop it (kill {record.get('pid')} on {record.get('host')}), then run "
        "this command again: it resumes."
    )


def _holder_text(found: Any) -> str:
    if not isinstance(found, dict):
        return f"a launch whose {FILENAME} cannot be read"
    return f"process {found.get('pid')} on host {found.get('host')}"


def _fenced(root: Path, found: dict[str, Any]) -> None:
    """This launch was taken over while it was silent: say so and end, writing nothing more."""
    print(
        f"ember: {root} was taken over by {_holder_text(found)} while this launch was silent; it ends here "
        f"without writing more (exit {REQUEUE_STATUS}).",
        file=sys.stderr,
        flush=True,
    )
    os._exit(REQUEUE_STATUS)


def _process() -> dict[str, Any]:
    """This process as a holder record names it: host, process id, PID namespace, start time."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "pid_namespace": _namespace(), "started": _started(pid)}


def _alive(found: dict[str, Any]) -> bool | None:
    """Whether the holder ``found`` names is a live process: ``None`` when it cannot be seen from here."""
    if found.get("host") != socket.gethostname() or found.get("pid_namespace") != _namespace():
        return None
    pid = found.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    if not running(pid):
        return False
    started = _started(pid)
    return started is None or found.get("started") in (None, started)  # a pid reused since is another process


def _namespace() -> str | None:
    with contextlib.suppress(OSError):
        return os.readlink("/proc/self/ns/pid")
    return None


def _started(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux), so a reused pid is told apart."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _read(root: Path) -> dict[str, Any] | str | None:
    """The holder record in ``root``: ``None`` if there is none, its text if it cannot be read as one."""
    try:
        text = (root / FILENAME).read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"unreadable: {e}"
    try:
        found = json.loads(text)
    except ValueError:
        return text
    return found if isinstance(found, dict) else text


def _write(root: Path, record: dict[str, Any]) -> None:
    replace_file(root, FILENAME, json.dumps(record))


@contextlib.contextmanager
def _guard(root: Path) -> Generator[None]:
    """An exclusive ``flock`` of ``root`` while a holder is read and written (none where the file system has none)."""
    try:
        fd = os.open(root, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + _GUARD_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:  # another launch decides now: milliseconds, unless it was stopped there
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            except OSError:  # no locks here (some network file systems)
                break
        yield
    finally:
        os.close(fd)  # the lock goes with the descriptor


def _silence(given: float | None) -> Any:
    if given is not None:
        return given
    text = os.environ.get("EMBER_HOLD_SILENCE", "")
    try:
        return float(text) if text else SILENCE
    except ValueError:
        raise ValueError(f"EMBER_HOLD_SILENCE must be a number of seconds, got {text!r}.") from None


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
