"""StallWatchdog: a hang becomes a diagnosis on disk and exit status 75, not a silent wait."""

import re
import threading
import time

import pytest

from ember import Engine, Events
from ember.handlers import StallWatchdog
from ember.handlers._resilience.stall import running_handler
from tests.slow_writes import slow_checkpoint_writes
from tests.subprocesses import ROOT, run_python

SCRIPT = ROOT / "tests" / "handlers" / "stall_script.py"


def test_a_handler_that_hangs_ends_the_process_with_its_stack_on_disk(tmp_path):
    started = time.monotonic()
    done = run_python([str(SCRIPT), str(tmp_path / "run")], timeout=50)  # the handler alone would sleep 60 s
    assert done.returncode == 75, done.stderr[-2000:]
    assert time.monotonic() - started < 45
    assert "the run was not stopped" not in done.stdout
    report = (tmp_path / "run" / "stall-process0.txt").read_text()
    first, engine_line = report.splitlines()[:2]
    assert re.fullmatch(
        r"ember: StallWatchdog: no iteration \(step_timeout=1\) completed in time\. Process 0 of 1 \(pid \d+\) stops "
        r"here with exit status 75; relaunch to resume from the last checkpoint\.",
        first,
    )
    assert re.fullmatch(
        r"the engine: last event Events\.ITERATION_COMPLETED, iteration 3, epoch 1; running sleepy \(.*stall_script\.py"
        r":\d+\)",
        engine_line,
    )
    assert re.search(r'File ".*stall_script\.py", line \d+ in sleepy', report)  # faulthandler's stacks
    assert "Thread 0x" in report or "Current thread 0x" in report
    assert first in done.stderr


def watch_ended(watchdog: StallWatchdog) -> bool:
    """Whether the watching thread has ended, waiting for it at most 30 s (an event, not a sleep past a deadline)."""
    assert watchdog.watch.thread is not None  # it was started
    return watchdog.watch.join(timeout=30)


def test_a_run_that_keeps_making_progress_is_left_alone(tmp_path):
    """Iterations 0.2 s apart under a 5 s step deadline; the run completes, its watch ends, nothing is written."""
    ended = []
    engine = Engine(lambda e, b: time.sleep(0.2))
    watchdog = StallWatchdog(tmp_path, step_timeout=5.0, startup_timeout=5.0, exit=ended.append)
    watchdog.attach(engine)
    engine.run(range(8))
    assert watch_ended(watchdog)
    assert ended == []
    assert list(tmp_path.iterdir()) == []


def test_an_evaluation_counts_as_progress_and_its_first_iteration_gets_the_startup_deadline(tmp_path):
    ended, compiled = [], []

    def evaluate(engine, batch):  # the first iteration of the first evaluation "compiles": 2.5 s, past step_timeout
        time.sleep(0.3 if compiled else 2.5)
        compiled.append(True)

    trainer, evaluator = Engine(lambda e, b: None), Engine(evaluate)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: evaluator.run(range(8)))
    watchdog = StallWatchdog(tmp_path, step_timeout=2.0, startup_timeout=30.0, exit=ended.append)
    watchdog.attach(trainer, evaluators=[evaluator])
    trainer.run(range(2), max_epochs=2)  # each evaluation past step_timeout in all, each iteration within its deadline
    assert watch_ended(watchdog)
    assert ended == []
    assert len(compiled) == 16


def test_the_diagnosis_names_the_handler_the_engine_runs():
    seen = []
    engine = Engine(lambda e, b: None)
    main = threading.get_ident()

    def look(engine):
        seen.append(running_handler(main))

    engine.add_event_handler(Events.COMPLETED, look)
    engine.run([0])
    assert re.fullmatch(r".*look \(.*test_stall\.py:\d+\)", seen[0])
    assert running_handler(None) == "no handler: the engine is not running on that thread"


def test_bad_arguments_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=re.escape("`step_timeout` must be a positive number of seconds, got 0.")):
        StallWatchdog(tmp_path, step_timeout=0)
    with pytest.raises(ValueError, match=re.escape("`save_timeout` must be a positive number of seconds or None")):
        StallWatchdog(tmp_path, save_timeout=-1)
    with pytest.raises(TypeError, match=re.escape("`run_dir` must be a folder path, got int.")):
        StallWatchdog(3)  # type: ignore[arg-type]


@pytest.fixture
def slow_writes(monkeypatch):
    """Every checkpoint write takes 2.5 s more (a slow network file system)."""
    slow_checkpoint_writes(monkeypatch, 2.5)


@pytest.mark.parametrize("save_timeout", [None, 10.0])
def test_the_wait_for_the_last_checkpoint_write_is_the_saves_time_not_a_steps(tmp_path, slow_writes, save_timeout):
    """The run's last save blocks COMPLETED for 2.5 s, over two step deadlines: not a stall, whatever save_timeout."""
    from ember.handlers import Checkpoint

    ended = []
    engine = Engine(lambda e, b: b)
    saver = Checkpoint({"trainer": engine}, tmp_path / "checkpoints")
    saver.attach(engine, Events.COMPLETED)
    watchdog = StallWatchdog(
        tmp_path / "run", step_timeout=1.0, startup_timeout=30.0, save_timeout=save_timeout, exit=ended.append
    )
    watchdog.attach(engine, checkpoints=[saver])
    engine.run(range(3))
    assert (ended, watchdog.stalled) == ([], None)
    assert saver.last_checkpoint.name == "step_00000003"
    saver.store.close()


def test_a_last_write_past_save_timeout_is_reported_as_a_save_stall(tmp_path, slow_writes):
    from ember.handlers import Checkpoint

    ended = []
    engine = Engine(lambda e, b: b)
    saver = Checkpoint({"trainer": engine}, tmp_path / "checkpoints")
    saver.attach(engine, Events.COMPLETED)
    watchdog = StallWatchdog(tmp_path / "run", step_timeout=10.0, save_timeout=0.3, exit=ended.append)
    watchdog.attach(engine, checkpoints=[saver])
    engine.run(range(3))
    saver.store.close()
    assert ended == [75]
    assert watchdog.stalled.startswith("ember: StallWatchdog: no checkpoint write finished in ")
    assert f"(save_timeout=0.3), in {tmp_path / 'checkpoints'}. Process 0 of 1" in watchdog.stalled


def test_quick_background_saves_over_a_run_longer_than_save_timeout_never_trip_it(tmp_path):
    """Saves every 2 iterations, each done in milliseconds, over 4 s of run with save_timeout=3: no stall.

    The watchdog read a save not yet waited for (a Checkpoint waits only at its next save) as a write in progress,
    and ended every such run 3 s after its first save. A busy machine only makes the run longer; a write of these few
    bytes has 3 s to finish.
    """
    from ember.handlers import Checkpoint

    ended = []
    engine = Engine(lambda e, b: time.sleep(0.1) or b)
    saver = Checkpoint({"trainer": engine}, tmp_path / "checkpoints", n_saved=2)
    saver.attach(engine, Events.ITERATION_COMPLETED(every=2))
    watchdog = StallWatchdog(tmp_path / "run", step_timeout=10.0, save_timeout=3.0, exit=ended.append)
    watchdog.attach(engine, checkpoints=[saver])
    engine.run(range(40))
    assert (ended, watchdog.stalled) == ([], None)
    assert [c.step for c in saver.store.checkpoints()] == [38, 40]
    saver.store.close()


def test_a_foreground_save_that_hangs_is_diagnosed_as_a_save_stall(tmp_path, slow_writes):
    """A synchronous save (background=False) taking 2.5 s, past save_timeout=0.3: a save stall, not a step's."""
    from ember.handlers import Checkpoint

    ended = []
    engine = Engine(lambda e, b: b)
    saver = Checkpoint({"trainer": engine}, tmp_path / "checkpoints", background=False)
    saver.attach(engine, Events.ITERATION_COMPLETED(once=2))
    watchdog = StallWatchdog(tmp_path / "run", step_timeout=10.0, save_timeout=0.3, exit=ended.append)
    watchdog.attach(engine, checkpoints=[saver])
    engine.run(range(3))
    saver.store.close()
    assert ended == [75]
    assert watchdog.stalled.startswith("ember: StallWatchdog: no checkpoint write finished in ")
    assert f"(save_timeout=0.3), in {tmp_path / 'checkpoints'}. Process 0 of 1" in watchdog.stalled


def test_a_paused_run_is_not_a_stalled_one(tmp_path):
    """interrupt() at iteration 2, then 2.5 s (over two step deadlines) before the run goes on: no diagnosis."""
    ended = []
    engine = Engine(lambda e, b: b)
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=2), lambda e: e.interrupt())
    watchdog = StallWatchdog(tmp_path, step_timeout=1.0, startup_timeout=30.0, exit=ended.append)
    watchdog.attach(engine)
    assert engine.run(range(4)).iteration == 2
    time.sleep(2.5)  # at least this long paused: a lower bound, which a busy machine only lengthens
    assert engine.run(range(4)).iteration == 4
    assert watch_ended(watchdog)
    assert (ended, watchdog.stalled) == ([], None)
