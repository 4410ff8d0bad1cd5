"""`hold`: one live launch per folder; a dead holder taken over at once, a silent one elsewhere after the silence."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from ember import _run_holder
from ember._run_holder import FILENAME, hold
from ember.errors import RunHeldError
from tests.subprocesses import PYTHONPATH


def holder_file(folder, **changes):
    """A holder record of this process, with ``changes``, written into ``folder``."""
    record = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_namespace": _run_holder._namespace(),
        "started": _run_holder._started(os.getpid()),
        "since": "2026-12-02 10:00:00 UTC",
        "token": "theirs",
        "beat": 0,
    }
    record.update(changes)
    (folder / FILENAME).write_text(json.dumps(record))
    return record


def refusal(folder, pid, host, what="run"):
    return (
        f"{folder} is held by another launch of this {what}: process {pid} on host {host}, since 2026-12-02 "
        f"10:00:00 UTC (held-by.json). Wait for it to end, or stop it (kill {pid} on {host}), then run this command "
        "again: it resumes."
    )


def refused_while(folder, start, stop):
    """The refusal of a launch made while another writer (``start`` starts it, ``stop`` ends it) acts on ``folder``."""
    start()
    try:
        with pytest.raises(RunHeldError) as caught:
            hold(folder, "run", silence=30, say=lambda _: None)
    finally:
        stop()
    return str(caught.value)


def test_a_live_holder_on_this_machine_refuses_a_second_launch_naming_it(tmp_path):
    holder_file(tmp_path)
    with pytest.raises(RunHeldError) as caught:
        hold(tmp_path, "run")
    assert str(caught.value) == refusal(tmp_path, os.getpid(), socket.gethostname())
    assert json.loads((tmp_path / FILENAME).read_text())["token"] == "theirs"  # untouched


def test_a_watcher_is_refused_in_the_same_words_with_its_name(tmp_path):
    holder_file(tmp_path)
    with pytest.raises(RunHeldError) as caught:
        hold(tmp_path, "watcher 'w'")
    assert str(caught.value) == refusal(tmp_path, os.getpid(), socket.gethostname(), "watcher 'w'")


def test_a_dead_holder_is_taken_over_at_once_and_saying_nothing(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holder_file(tmp_path, pid=int(done.stdout), started=None)  # that process has ended
    said = []
    started = time.monotonic()
    with hold(tmp_path, "run", say=said.append) as holder:
        assert json.loads((tmp_path / FILENAME).read_text())["token"] == holder.record["token"]
    assert time.monotonic() - started < 5
    assert said == []
    assert not (tmp_path / FILENAME).exists()


def test_a_pid_reused_since_by_another_process_is_a_dead_holder(tmp_path):
    holder_file(tmp_path, started=_run_holder._started(os.getpid()) + 1)  # this pid, but another start: not the holder
    with hold(tmp_path, "run") as holder:
        assert holder.record["pid"] == os.getpid()


def test_a_silent_holder_elsewhere_is_taken_over_after_the_silence_with_one_line(tmp_path):
    holder_file(tmp_path, host="gpu-7", pid=4242)
    said = []
    started = time.monotonic()
    with hold(tmp_path, "run", silence=0.5, say=said.append):
        waited = time.monotonic() - started
        assert json.loads((tmp_path / FILENAME).read_text())["host"] == socket.gethostname()
    assert 0.5 <= waited < 10
    assert said == [
        f"ember: process 4242 on host gpu-7 holds {tmp_path} from where it cannot be seen; waiting up to 0.5 s for "
        "its beat before taking its place."
    ]


def test_a_holder_elsewhere_that_beats_refuses_the_launch(tmp_path):
    record = holder_file(tmp_path, host="gpu-7", pid=4242)
    stop = threading.Event()

    def beat():
        while not stop.wait(0.1):
            record["beat"] += 1
            (tmp_path / FILENAME).write_text(json.dumps(record))

    beating = threading.Thread(target=beat)
    assert refused_while(tmp_path, beating.start, lambda: (stop.set(), beating.join())) == refusal(
        tmp_path, 4242, "gpu-7"
    )


def test_a_damaged_holder_file_is_watched_and_taken_when_nothing_repairs_it(tmp_path):
    (tmp_path / FILENAME).write_text('{"host": "gpu-7", "pi')  # truncated
    said = []
    with hold(tmp_path, "run", silence=0.3, say=said.append) as holder:
        assert json.loads((tmp_path / FILENAME).read_text())["token"] == holder.record["token"]
    assert said == [
        f"ember: a launch whose held-by.json cannot be read holds {tmp_path} from where it cannot be seen; waiting "
        "up to 0.3 s for its beat before taking its place."
    ]


def test_a_damaged_holder_file_a_live_holder_rewrites_refuses_the_launch(tmp_path):
    (tmp_path / FILENAME).write_text("{")
    repaired = {"host": "gpu-7", "pid": 4242, "since": "2026-12-02 10:00:00 UTC", "token": "theirs", "beat": 1}
    timer = threading.Timer(0.3, lambda: (tmp_path / FILENAME).write_text(json.dumps(repaired)))
    assert refused_while(tmp_path, timer.start, timer.cancel) == refusal(tmp_path, 4242, "gpu-7")


def test_the_holder_beats_and_gives_back_only_its_own_file(tmp_path):
    with hold(tmp_path, "run", beat=0.05) as holder:
        deadline = time.monotonic() + 30
        while json.loads((tmp_path / FILENAME).read_text())["beat"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert not (tmp_path / FILENAME).exists()
    holder = hold(tmp_path, "run", beat=60)
    holder_file(tmp_path, token="the next launch's")  # taken over while this one was silent
    holder.release()
    assert json.loads((tmp_path / FILENAME).read_text())["token"] == "the next launch's"


FENCED = """
import sys, time
from ember._run_holder import hold
holder = hold(sys.argv[1], "run", beat=0.1)
print("held", flush=True)
time.sleep(60)
"""


def test_a_holder_taken_over_while_silent_says_so_and_exits_75_at_its_next_beat(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", FENCED, str(tmp_path)],
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "held\n"  # type: ignore[union-attr]
        holder_file(tmp_path, host="gpu-7", pid=4242, token="the next launch's")
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 75
    assert err == (
        f"ember: {tmp_path} was taken over by process 4242 on host gpu-7 while this launch was silent; it ends here "
        "without writing more (exit 75).\n"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"silence": 0}, "`silence` must be a positive number of seconds, got 0."),
        ({"silence": -1.5}, "`silence` must be a positive number of seconds, got -1.5."),
        ({"beat": 0}, "`beat` must be a positive number of seconds, got 0."),
        ({"beat": True}, "`beat` must be a positive number of seconds, got True."),
    ],
)
def test_bad_waits_are_refused_naming_the_argument(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match="must be a positive number of seconds") as caught:
        hold(tmp_path, "run", **kwargs)
    assert str(caught.value) == message
    assert not (tmp_path / FILENAME).exists()


def test_the_silence_comes_from_the_environment_and_a_bad_one_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_HOLD_SILENCE", "soon")
    with pytest.raises(ValueError, match="EMBER_HOLD_SILENCE") as caught:
        hold(tmp_path, "run")
    assert str(caught.value) == "EMBER_HOLD_SILENCE must be a number of seconds, got 'soon'."
    monkeypatch.setenv("EMBER_HOLD_SILENCE", "0.2")
    holder_file(tmp_path, host="gpu-7", pid=4242)
    started = time.monotonic()
    with hold(tmp_path, "run", say=lambda _: None):
        assert 0.2 <= time.monotonic() - started < 10


def test_a_folder_the_hold_made_goes_with_it_if_nothing_was_written_there(tmp_path):
    with hold(tmp_path / "new", "run"):
        pass
    assert not (tmp_path / "new").exists()
    with hold(tmp_path / "new", "run"):
        (tmp_path / "new" / "config.yaml").write_text("")
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["config.yaml"]
    with hold(tmp_path, "run"):  # a folder that was there stays, empty or not
        pass
    assert tmp_path.exists()


def test_a_beat_that_cannot_be_written_is_missed_and_the_next_one_writes(tmp_path, monkeypatch):
    """A full disk at one beat: the holder keeps beating (no dead thread), and a deleted file is written again."""
    import errno

    write, failed = _run_holder._write, []

    def full_once(root, record):
        if not failed:
            failed.append(record["beat"])
            raise OSError(errno.ENOSPC, "No space left on device")
        write(root, record)

    with hold(tmp_path, "run", beat=0.05) as holder:
        monkeypatch.setattr(_run_holder, "_write", full_once)
        (tmp_path / FILENAME).unlink()  # deleted by hand: the next beat writes it again
        deadline = time.monotonic() + 30
        while not (tmp_path / FILENAME).exists() or json.loads((tmp_path / FILENAME).read_text())["beat"] < 3:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert json.loads((tmp_path / FILENAME).read_text())["token"] == holder.record["token"]
    assert failed == [1]
