import io

from ember import Engine, Events
from ember.handlers import HandlersTimeProfiler


def ticking():
    """A clock that moves one second at every read: each timed span is exactly one second."""
    ticks = iter(range(10_000))
    return lambda: float(next(ticks))


def log_every_second_iteration(engine):
    pass


def test_each_handler_the_data_and_the_step_are_timed_then_unwrapped():
    engine = Engine(lambda e, b: b)
    engine.add_event_handler(Events.ITERATION_COMPLETED(every=2), log_every_second_iteration)
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: None)
    out = io.StringIO()
    profiler = HandlersTimeProfiler(stream=out, clock=ticking())
    profiler.attach(engine)
    engine.run(range(4), max_epochs=2)
    results = profiler.results
    assert results["handlers"] == {
        "ITERATION_COMPLETED": {
            "log_every_second_iteration": {"count": 4, "total": 4.0, "mean": 1.0, "max": 1.0},
        },
        "EPOCH_COMPLETED": {
            "test_each_handler_the_data_and_the_step_are_timed_then_unwrapped.<locals>.<lambda>": {
                "count": 2,
                "total": 2.0,
                "mean": 1.0,
                "max": 1.0,
            },
        },
    }
    assert results["data"] == {"count": 8, "total": 8.0, "mean": 1.0, "max": 1.0}  # 4 batches an epoch
    assert results["step"] == {"count": 8, "total": 8.0, "mean": 1.0, "max": 1.0}
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["handler", "calls", "total", "s", "mean", "ms", "max", "ms"]
    assert lines[1].split()[:4] == ["ITERATION_COMPLETED:", "log_every_second_iteration", "4", "4.0000"]
    assert lines[-2].startswith("data (next batch)")
    assert lines[-1].split()[:3] == ["step", "(dispatch)", "8"]
    profiler.stream = None
    engine.run(range(4), max_epochs=3)  # a second run: wrapped again, once; unwrapped again at the end
    assert profiler.results["handlers"]["ITERATION_COMPLETED"]["log_every_second_iteration"]["count"] == 2


def test_undoing_the_wrap_restores_each_handler_and_leaves_removed_ones_removed():
    engine = Engine(lambda e, b: b)
    calls, wrapped = [], []

    def keep(engine):
        calls.append(engine.state.iteration)

    def gone(engine):
        calls.append("gone")

    engine.add_event_handler(Events.ITERATION_COMPLETED, keep)
    handle = engine.add_event_handler(Events.ITERATION_COMPLETED, gone)

    def count(event, handler, call):
        return lambda engine, *args: (wrapped.append(handler.__name__), call(engine, *args))

    undo = engine.wrap_handlers(count)
    engine.run(range(1))
    handle.remove()
    undo()
    engine.run(range(2))
    assert wrapped == ["keep", "gone"]
    assert calls == [1, "gone", 1, 2]
