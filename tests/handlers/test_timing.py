import re
import time

import jax.numpy as jnp
import pytest

from ember import Engine, Events
from ember.handlers import Profiler, TimeLimit, Timer
from tests.handlers.trainers import DATA, trainer


def ticking():
    ticks = iter(range(1000))
    return lambda: float(next(ticks))


def test_timer_whole_run_and_per_iteration_average():
    """Ignite's attach pattern: reset per epoch, count only inside iterations, average per step."""
    engine = Engine(lambda e, b: b)
    total, per_step = Timer(clock=ticking()), Timer(average=True, clock=ticking())
    total.attach(engine)
    per_step.attach(
        engine,
        start=Events.EPOCH_STARTED,
        resume=Events.ITERATION_STARTED,
        pause=Events.ITERATION_COMPLETED,
        step=Events.ITERATION_COMPLETED,
    )
    engine.run([1, 2, 3, 4])
    assert total.value() == 1.0  # one tick between STARTED and COMPLETED
    assert (per_step.value(), per_step.step_count, per_step.running) == (1.0, 4, False)


def test_timer_attach_returns_the_timer_as_ignites_does():
    """``Timer.attach`` returns the timer itself (Ignite's), so a migrated ``t = Timer().attach(...)`` keeps working."""
    engine = Engine(lambda e, b: b)
    timer = Timer(average=True)
    assert timer.attach(engine, step=Events.ITERATION_COMPLETED) is timer
    engine.run(range(4))
    assert timer.step_count == 4


class Pending:
    """A step's output that records when it is waited for: what an array still being computed would be."""

    def __init__(self, log):
        self.log = log

    def block_until_ready(self):
        self.log.append("waited")
        return self


@pytest.mark.parametrize("sync", [True, False])
def test_timer_sync_waits_for_the_output_before_it_reads_the_clock(sync):
    """sync=True: at every pause the output is waited for, then the clock read; sync=False: never waited for."""
    log = []

    def clock():
        log.append("clock")
        return 0.0

    engine = Engine(lambda e, b: {"loss": Pending(log)})
    timer = Timer(sync=sync, clock=clock)
    timer.attach(engine, start=Events.ITERATION_STARTED, pause=Events.ITERATION_COMPLETED)
    log.clear()  # the timer read its clock when it was made
    engine.run([1, 2])
    pair = ["clock", "waited", "clock"] if sync else ["clock", "clock"]  # start, (wait,) pause
    assert log == pair * 2


def test_timer_sync_on_a_trainer_times_real_work():
    """On a real trainer, sync=True times the steps' device work: a positive time, the output ready after it."""
    t = trainer()
    timer = Timer(sync=True)
    timer.attach(t, start=Events.ITERATION_STARTED, pause=Events.ITERATION_COMPLETED)
    t.run(DATA)
    assert 0 < timer.value() < 10
    assert t.state.output["loss"].is_ready()


def test_time_limit_stops_cleanly_and_restarts_its_clock():
    limit = TimeLimit(3, clock=ticking())
    engine = Engine(lambda e, b: b)
    limit.attach(engine)
    completed = []
    engine.add_event_handler(Events.COMPLETED, lambda e: completed.append(e.state.iteration))
    assert engine.run(range(100)).iteration == 3
    assert limit.reached
    assert completed == [3]
    engine.run(range(100), max_epochs=2)  # a new run: the clock starts again
    assert completed == [3, 6]
    with pytest.raises(ValueError, match=re.escape("`limit_sec` must be a positive number of seconds, got 0.")):
        TimeLimit(0)
    with pytest.raises(TypeError, match=re.escape("`limit_sec` must be a positive number of seconds, got str 'abc'.")):
        TimeLimit("abc")  # type: ignore[arg-type]


def test_time_limit_as_ignite_adds_it_counts_from_its_making():
    """trainer.add_event_handler(Events.ITERATION_COMPLETED, TimeLimit(limit_sec=...)), no attach: Ignite's way."""
    clock = ticking()
    engine = Engine(lambda e, b: b)
    engine.add_event_handler(Events.ITERATION_COMPLETED, TimeLimit(limit_sec=3, clock=clock))
    assert engine.run(range(100)).iteration == 3
    with pytest.raises(TypeError, match="unexpected keyword argument 'seconds'"):  # ember's name, never released
        TimeLimit(seconds=5)  # type: ignore[call-arg]


def test_time_limit_with_the_real_clock():
    """The real clock, read through a recorder: the run stops at the first check at or past the limit, only there.

    On a busy machine it checks fewer times, never at other places.
    """
    readings: list[float] = []

    def clock() -> float:
        readings.append(time.monotonic())
        return readings[-1]

    engine = Engine(lambda e, b: time.sleep(0.01))
    TimeLimit(0.05, check_every=1, clock=clock).attach(engine)
    iterations = engine.run(range(1000)).iteration
    start, checks = readings[1], readings[2:]  # readings[0] is the constructor's; the clock restarts at STARTED
    assert len(checks) == iterations < 1000
    assert [t - start >= 0.05 for t in checks] == [False] * (iterations - 1) + [True]


def test_profiler_traces_the_window_of_a_real_trainer(tmp_path):
    t = trainer()
    profiler = Profiler(tmp_path, start_step=2, num_steps=3)
    profiler.attach(t)
    t.run(DATA, max_epochs=2)
    assert profiler.traced == [2, 3, 4]
    traces = list(tmp_path.rglob("*.xplane.pb"))
    assert len(traces) == 1
    assert traces[0].stat().st_size > 0
    assert traces[0].parent.parent.name == "profile"  # logdir/plugins/profile/<run>/, where TensorBoard looks


def test_profiler_stops_when_the_run_ends_inside_the_window(tmp_path):
    engine = Engine(lambda e, b: jnp.float32(b) * 2)
    profiler = Profiler(tmp_path, start_step=2, num_steps=10)
    profiler.attach(engine)
    engine.run([1, 2, 3])
    assert profiler.traced == [2, 3]
    assert not profiler.active
    with pytest.raises(ValueError, match=re.escape("`num_steps` must be a positive int, got 0.")):
        Profiler(tmp_path, num_steps=0)


def test_spaced_checks_stop_at_the_next_multiple_and_default_by_process_count(monkeypatch, tmp_path):
    """check_every=4: a spent budget stops at the next multiple, a signal saves there or at the epoch's end.

    The default is every iteration in one process and every 10 in several.
    """
    import os
    import signal

    import jax

    from ember.handlers import Checkpoint, Preemption
    from ember.handlers._resilience.agreement import check_interval

    engine = Engine(lambda e, b: b)
    TimeLimit(3, check_every=4, clock=lambda: float(engine.state.iteration)).attach(engine)  # a second a step
    assert engine.run(range(100)).iteration == 4

    def run_preempted(epoch_length: int) -> tuple[int, int]:
        trainer = Engine(lambda e, b: b)
        preemption = Preemption(Checkpoint({"trainer": trainer}, tmp_path / str(epoch_length)), check_every=4)
        preemption.attach(trainer)
        trainer.add_event_handler(Events.ITERATION_COMPLETED(once=5), lambda: os.kill(os.getpid(), signal.SIGTERM))
        return trainer.run(range(epoch_length), max_epochs=3).iteration, preemption.saved.step

    assert run_preempted(epoch_length=10) == (8, 8)
    assert run_preempted(epoch_length=6) == (6, 6)  # epoch 1 ends at 6, before the multiple
    assert check_interval(None) == 1
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    assert check_interval(None) == 10
    with pytest.raises(ValueError, match=re.escape("`check_every` must be a positive int or None")):
        TimeLimit(3, check_every=0)


def test_a_session_a_time_limit_ended_is_resumed_by_the_next_session(tmp_path):
    """Ignite's use for TimeLimit: a job with a time limit per session, relaunched; each session trains on."""
    from ember.handlers import Checkpoint

    reached = []
    for _ in range(3):  # three sessions of one run, each a new engine resumed from the checkpoint
        engine = Engine(lambda e, b: b)
        saver = Checkpoint({"trainer": engine}, tmp_path)
        saver.attach(engine, Events.COMPLETED)
        TimeLimit(4, clock=lambda e=engine: float(e.state.iteration)).attach(engine)  # a second per iteration
        saver.resume()
        engine.run(range(5), max_epochs=2)
        saver.store.close()
        reached.append((engine.state.iteration, engine.should_terminate))
    assert reached == [(4, True), (8, True), (10, False)]  # stopped, stopped, the end: never "already complete"
