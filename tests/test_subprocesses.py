"""The tests' own harness for scripts many tests share: bounded by progress, and a failure is one test's."""

import os
import sys
import time

import pytest

from tests.subprocesses import SharedResults, run_while_progressing


def test_a_failed_shared_script_fails_the_first_test_that_reads_it_and_skips_the_rest_naming_it():
    shared = SharedResults(failure="sharded_script.py exited 1: boom")
    with pytest.raises(AssertionError, match=r"^sharded_script\.py exited 1: boom$"):
        shared["devices"]
    with pytest.raises(pytest.skip.Exception, match=r"failed in an earlier test: sharded_script\.py exited 1: boom"):
        shared["devices"]
    assert SharedResults({"devices": 8})["devices"] == 8


def test_a_script_is_ended_when_it_stops_progressing_not_at_a_total_deadline():
    """Quiet and idle for 2 s: ended with its output; one that keeps working past 2 s in all runs to its end."""
    started = time.monotonic()
    stuck = [sys.executable, "-c", "import sys, time; print('started', file=sys.stderr, flush=True); time.sleep(60)"]
    with pytest.raises(TimeoutError, match=r"no progress for 2 s; its last output:\nstarted\n$"):
        run_while_progressing(stuck, dict(os.environ), quiet=2)
    assert time.monotonic() - started < 30  # not the 60 s it sleeps
    busy = "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end: pass\nprint('done')"
    assert run_while_progressing([sys.executable, "-c", busy], dict(os.environ), quiet=2).stdout == "done\n"
    with pytest.raises(TimeoutError, match="still running after 1 s"):
        run_while_progressing([sys.executable, "-c", busy], dict(os.environ), quiet=2, limit=1)
