"""Every stock handler's ``attach`` returns one handle whose ``remove()`` undoes everything it registered."""

import jax.numpy as jnp
import optax
import optuna
import pytest

from ember import Engine, Events
from ember.handlers import (
    Checkpoint,
    EarlyStopping,
    EpochOutputStore,
    Evaluate,
    GradientSpikeMonitor,
    GradsHistHandler,
    GradsScalarHandler,
    HandlersTimeProfiler,
    LRMonitor,
    ModelCheckpoint,
    OptunaPruning,
    ParamStats,
    Preemption,
    ProcessWatchdog,
    Profiler,
    ProgressBar,
    RollbackOnDivergence,
    ScalarLogger,
    StallWatchdog,
    TerminateOnNan,
    Throughput,
    TimeLimit,
    Timer,
    WeightsHistHandler,
    WeightsScalarHandler,
    attach_writer,
)
from ember.training import ReduceLROnPlateau, TrainState, create_evaluator, create_trainer, scale_by_plateau
from ember.writers import AsyncWriter, JsonlWriter


def registered(*engines):
    """Every engine's registrations, as (event, handler) pairs in order (read from the engine's dispatch table)."""
    return [[(event, reg.handler) for event, d in e._dispatch.items() for reg in d.regs] for e in engines]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # a study per test, announced at INFO otherwise
    state = TrainState.create(lambda p, x: x @ p, jnp.zeros(4), scale_by_plateau(optax.sgd(0.1)))
    trainer = create_trainer(state, lambda m, b: jnp.mean((m(b["x"]) - b["y"]) ** 2))
    evaluator = create_evaluator(trainer, lambda m, b: {"y_pred": m(b["x"]), "y": b["y"]})
    return trainer, evaluator, tmp_path_factory.mktemp("handles")


# name -> attach(trainer, evaluator, run folder, writer, optuna trial), returning what attach returns
ATTACH = {
    "Evaluate": lambda trainer, evaluator, run, writer, trial: Evaluate(evaluator, [], writer=writer).attach(trainer),
    "EarlyStopping": lambda trainer, evaluator, run, writer, trial: EarlyStopping(3, lambda e: 0.0, trainer).attach(
        evaluator
    ),
    "Checkpoint": lambda trainer, evaluator, run, writer, trial: Checkpoint({"trainer": trainer}, run / "c").attach(
        trainer
    ),
    "ModelCheckpoint": lambda trainer, evaluator, run, writer, trial: trainer.add_event_handler(
        Events.EPOCH_COMPLETED, ModelCheckpoint(run / "m", "net", require_empty=False), {"trainer": trainer}
    ),  # Ignite's way: a handler to add, not to attach
    "TerminateOnNan": lambda trainer, evaluator, run, writer, trial: TerminateOnNan().attach(trainer),
    "TimeLimit": lambda trainer, evaluator, run, writer, trial: TimeLimit(600).attach(trainer),
    "ProgressBar": lambda trainer, evaluator, run, writer, trial: ProgressBar().attach(trainer, output_keys=["loss"]),
    "ScalarLogger": lambda trainer, evaluator, run, writer, trial: ScalarLogger(writer).attach(
        trainer, Events.ITERATION_COMPLETED
    ),
    "LRMonitor": lambda trainer, evaluator, run, writer, trial: LRMonitor(
        writer, schedule=optax.constant_schedule(0.1)
    ).attach(trainer),
    "GradientSpikeMonitor": lambda trainer, evaluator, run, writer, trial: GradientSpikeMonitor(factor=5.0).attach(
        trainer
    ),
    "ParamStats": lambda trainer, evaluator, run, writer, trial: ParamStats(writer).attach(trainer),
    "Profiler": lambda trainer, evaluator, run, writer, trial: Profiler(run / "p", start_step=2, num_steps=1).attach(
        trainer
    ),
    "Throughput": lambda trainer, evaluator, run, writer, trial: Throughput(writer, every=4).attach(trainer),
    "HandlersTimeProfiler": lambda trainer, evaluator, run, writer, trial: HandlersTimeProfiler(stream=None).attach(
        trainer
    ),
    "Preemption": lambda trainer, evaluator, run, writer, trial: Preemption(
        Checkpoint({"trainer": trainer}, run / "pre")
    ).attach(trainer, [evaluator]),
    "ProcessWatchdog": lambda trainer, evaluator, run, writer, trial: ProcessWatchdog().attach(trainer),
    "StallWatchdog": lambda trainer, evaluator, run, writer, trial: StallWatchdog(run).attach(
        trainer, evaluators=[evaluator]
    ),
    "RollbackOnDivergence": lambda trainer, evaluator, run, writer, trial: RollbackOnDivergence(
        Checkpoint({"trainer": trainer}, run / "r")
    ).attach(trainer),
    "EpochOutputStore": lambda trainer, evaluator, run, writer, trial: EpochOutputStore().attach(trainer, "outputs"),
    "OptunaPruning": lambda trainer, evaluator, run, writer, trial: OptunaPruning(trial, "loss", trainer).attach(
        evaluator
    ),
    "ReduceLROnPlateau": lambda trainer, evaluator, run, writer, trial: ReduceLROnPlateau(trainer, "loss").attach(
        evaluator
    ),
    "GradsScalarHandler": lambda trainer, evaluator, run, writer, trial: GradsScalarHandler(writer).attach(trainer),
    "WeightsScalarHandler": lambda trainer, evaluator, run, writer, trial: WeightsScalarHandler(writer).attach(trainer),
    "GradsHistHandler": lambda trainer, evaluator, run, writer, trial: GradsHistHandler(writer).attach(trainer),
    "WeightsHistHandler": lambda trainer, evaluator, run, writer, trial: WeightsHistHandler(writer).attach(trainer),
}


@pytest.mark.parametrize("name", list(ATTACH))
def test_removing_an_attach_leaves_the_engines_as_they_were(engines, name):
    """The handle removes every registration the attach made, on the trainer and on the evaluator."""
    trainer, evaluator, run = engines
    before = registered(trainer, evaluator)
    writer, trial = JsonlWriter(run / f"{name}.jsonl"), optuna.create_study().ask()
    handle = ATTACH[name](trainer, evaluator, run / name, writer, trial)
    added = sum(map(len, registered(trainer, evaluator))) - sum(map(len, before))
    assert added >= 1
    handle.remove()
    assert registered(trainer, evaluator) == before
    handle.remove()  # a second remove does nothing
    assert registered(trainer, evaluator) == before


def test_the_timer_returns_itself_as_ignites_and_detaches_everything():
    engine = Engine(lambda e, b: b)
    before = registered(engine)
    timer = Timer(average=True).attach(engine, step=Events.ITERATION_COMPLETED, resume=Events.ITERATION_STARTED)
    assert isinstance(timer, Timer)
    assert sum(map(len, registered(engine))) == 4
    timer.detach()
    assert registered(engine) == before


def test_loggers_sharing_a_writer_keep_its_flush_until_the_last_is_removed(tmp_path):
    """Two loggers on one writer share its flush on the engine: removing one leaves it to the other."""
    engine = Engine(lambda e, b: {"loss": b})
    writer = JsonlWriter(tmp_path / "m.jsonl")
    first = ScalarLogger(writer, output_keys=["loss"]).attach(engine, Events.ITERATION_COMPLETED)
    second = ScalarLogger(writer, tag="again", output_keys=["loss"]).attach(engine, Events.ITERATION_COMPLETED)
    flushes = [h for e, h in registered(engine)[0] if e is Events.COMPLETED]
    assert len(flushes) == 1
    first.remove()
    assert [h for e, h in registered(engine)[0] if e is Events.COMPLETED] == flushes
    engine.run([1.0, 2.0])
    assert (tmp_path / "m.jsonl").read_text().count('"again/loss"') == 2  # flushed at COMPLETED
    second.remove()
    assert registered(engine) == [[]]


def test_attach_writer_for_a_writer_of_your_own_is_removed_by_its_handle(tmp_path):
    engine = Engine(lambda e, b: b)
    handle = attach_writer(AsyncWriter(JsonlWriter(tmp_path / "m.jsonl")), engine)
    handle.remove()
    assert registered(engine) == [[]]
