"""`Evaluations`: several named evaluations on their own schedules, published as name/metric, run first."""

import json
import os
import signal

import pytest

from ember import Engine, Events
from ember.handlers import Checkpoint, EarlyStopping, Evaluations, Preemption
from ember.metrics import Average
from ember.writers import JsonlWriter


def evaluator(log: list, name: str) -> Engine:
    """An evaluator of one metric, ``mean``; it logs its STARTED and COMPLETED."""
    engine = Engine(lambda e, b: b)
    Average().attach(engine, "mean")
    engine.add_event_handler(Events.STARTED, lambda: log.append(f"{name} started"))
    engine.add_event_handler(Events.COMPLETED, lambda e: log.append(f"{name} {e.state.metrics['mean']}"))
    return engine


def data_of(trainer: Engine, value) -> object:
    class Data:  # one batch, read when the evaluation runs: its value follows the trainer's iteration
        def __iter__(self):
            return iter([float(value(trainer.state.iteration))])

        def __len__(self):
            return 1

    return Data()


def two_evaluations(log: list, writer=None, trainer=None):
    trainer = trainer or Engine(lambda e, b: b)
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: log.append(f"iteration {e.state.iteration}"))
    evaluations = Evaluations(trainer, writer=writer)
    clean = lambda it: it / 8  # noqa: E731
    noisy = lambda it: {2: 0.5, 4: 0.875, 6: 0.625}.get(it, 0.0)  # noqa: E731
    evaluations.add("clean", evaluator(log, "clean"), data_of(trainer, clean), Events.EPOCH_COMPLETED)
    evaluations.add("noisy", evaluator(log, "noisy"), data_of(trainer, noisy), Events.ITERATION_COMPLETED(every=2))
    return trainer, evaluations


def test_two_evaluations_on_their_own_schedules_run_in_order_and_publish_under_their_names(tmp_path):
    log: list = []
    writer = JsonlWriter(tmp_path / "metrics.jsonl")
    trainer, evaluations = two_evaluations(log, writer)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: log.append(f"epoch {e.state.epoch}"))
    state = trainer.run([0, 0, 0], max_epochs=2)
    assert log == [
        "iteration 1",
        "noisy started",  # before the trainer's own ITERATION_COMPLETED handler, attached first
        "noisy 0.5",
        "iteration 2",
        "iteration 3",
        "clean started",
        "clean 0.375",
        "epoch 1",
        "noisy started",
        "noisy 0.875",
        "iteration 4",
        "iteration 5",
        "noisy started",
        "noisy 0.625",
        "iteration 6",
        "clean started",
        "clean 0.75",
        "epoch 2",
    ]
    assert state.metrics == {"noisy/mean": 0.625, "clean/mean": 0.75}
    assert evaluations["clean"].history == [(3, {"mean": 0.375}), (6, {"mean": 0.75})]
    assert evaluations["noisy"].history == [(2, {"mean": 0.5}), (4, {"mean": 0.875}), (6, {"mean": 0.625})]
    writer.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in row.items() if k != "time"} for row in rows] == [
        {"step": 2, "noisy/mean": 0.5},
        {"step": 3, "clean/mean": 0.375},
        {"step": 4, "noisy/mean": 0.875},
        {"step": 6, "noisy/mean": 0.625},
        {"step": 6, "clean/mean": 0.75},
    ]


def test_a_schedule_of_two_events_due_at_one_iteration_evaluates_once_there():
    """Every epoch (4 iterations) and every 2 iterations, and at the end: each iteration evaluated at most once."""
    log: list = []
    trainer = Engine(lambda e, b: b)
    evaluations = Evaluations(trainer)
    schedule = Events.EPOCH_COMPLETED | Events.ITERATION_COMPLETED(every=2) | Events.COMPLETED
    evaluations.add("clean", evaluator(log, "clean"), data_of(trainer, lambda it: it), schedule)
    trainer.run(range(4), max_epochs=2)
    assert [step for step, _ in evaluations["clean"].history] == [2, 4, 6, 8]
    assert log == [line for step in (2, 4, 6, 8) for line in ("clean started", f"clean {step}.0")]


def test_a_new_run_of_the_trainer_evaluates_at_the_iteration_the_last_run_ended_on():
    """Two folds of one epoch each end at iteration 2: each is evaluated there, once."""
    log: list = []
    trainer = Engine(lambda e, b: b)
    evaluations = Evaluations(trainer)
    evaluations.add("clean", evaluator(log, "clean"), data_of(trainer, lambda it: it), Events.EPOCH_COMPLETED)
    trainer.run(range(2), max_epochs=1)
    trainer.run(range(2), max_epochs=1)
    assert evaluations["clean"].history == [(2, {"mean": 2.0}), (2, {"mean": 2.0})]


def test_a_checkpoint_on_the_trainer_keeps_the_best_of_the_second_evaluation(tmp_path):
    trainer = Engine(lambda e, b: b)
    # attached before the evaluation it scores, at the same event: the evaluation still runs first
    best = Checkpoint({"trainer": trainer}, tmp_path, score_name="noisy/mean", n_saved=1)
    trainer.add_event_handler(Events.ITERATION_COMPLETED(every=2), best)
    two_evaluations([], trainer=trainer)
    trainer.run([0, 0, 0], max_epochs=2)
    best.wait()
    kept = best.store.checkpoints()
    assert [(c.path.name, c.step, c.metrics) for c in kept] == [
        ("step_00000004-noisy_mean=0.8750", 4, {"noisy/mean": 0.875})
    ]


def test_early_stopping_on_the_trainer_reads_a_named_score_at_its_own_event():
    log: list = []
    trainer = Engine(lambda e, b: b)
    # the early stop is attached first; the evaluation at its event still runs before it
    trainer.add_event_handler(Events.ITERATION_COMPLETED(every=2), lambda e: stopper(e))
    evaluations = two_evaluations(log, trainer=trainer)[1]
    stopper = EarlyStopping(1, evaluations.score("noisy/mean"), trainer)
    # 0.5, 0.875, then 0.625: no better, and patience 1 ends the run at iteration 6, where it would have ended
    assert trainer.run([0, 0, 0], max_epochs=3).iteration == 6
    assert stopper.best_score == 0.875


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda ev: ev.add("clean", Engine(lambda e, b: b), [1]), ValueError, "`name` 'clean' is taken"),
        (lambda ev: ev.add("a/b", Engine(lambda e, b: b), [1]), ValueError, "without '/', got 'a/b'"),
        (lambda ev: ev.add("", Engine(lambda e, b: b), [1]), ValueError, "non-empty string without '/', got ''"),
        (lambda ev: ev.add("x", Engine(lambda e, b: b), [1], "epoch"), TypeError, "got 'epoch'"),
        (
            lambda ev: ev.add("x", Engine(lambda e, b: b), [1], Events.ITERATION_COMPLETED(every=0)),
            ValueError,
            "`every` must be a positive int, got 0",
        ),
        (lambda ev: ev.score("val/mean"), ValueError, "'val/mean' names no evaluation of this run: it evaluates"),
        (lambda ev: ev.score("clean"), ValueError, "must be 'name/metric' (e.g. 'val/accuracy'), got 'clean'"),
        (lambda ev: ev["val"], KeyError, "No evaluation is named 'val'; this run evaluates ['clean', 'noisy']"),
    ],
)
def test_bad_input_is_refused_with_what_was_expected(call, error, message):
    _, evaluations = two_evaluations([])
    with pytest.raises(error) as raised:
        call(evaluations)
    assert message in str(raised.value)
    assert evaluations.names == ["clean", "noisy"]


def test_a_score_read_before_its_evaluation_published_says_so():
    trainer, evaluations = two_evaluations([])
    score = evaluations.score("clean/mean")
    with pytest.raises(KeyError, match=r"'clean/mean' was read before 'clean' published it .*0 evaluations so far"):
        score(trainer)


def preempted_run(tmp_path, signal_at: int | None, schedule=Events.EPOCH_COMPLETED):
    """Three epochs of two iterations, evaluated over four batches on ``schedule``.

    SIGTERM arrives in the evaluation at the trainer's iteration ``signal_at``.
    """
    trainer = Engine(lambda e, b: b)
    evaluator = Engine(lambda e, b: b)
    Average().attach(evaluator, "mean")
    saver = Checkpoint({"trainer": trainer}, tmp_path / "checkpoints")
    evaluations = Evaluations(trainer, writer=JsonlWriter(tmp_path / "metrics.jsonl"))

    class Data:  # four batches whose mean is the trainer's iteration
        def __iter__(self):
            return iter([float(trainer.state.iteration)] * 4)

    evaluations.add("val", evaluator, Data(), schedule)
    preemption = Preemption(saver)
    preemption.attach(trainer, [evaluator])
    trainer.preemption = preemption  # for the test to read what it saved
    if signal_at is not None:

        def preempt() -> None:
            if trainer.state.iteration == signal_at:
                os.kill(os.getpid(), signal.SIGTERM)

        evaluator.add_event_handler(Events.ITERATION_COMPLETED(once=2), preempt)
    return trainer, evaluations, saver


def records(path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    ("schedule", "event", "only_at_4"),
    [
        (Events.EPOCH_COMPLETED, "epoch_completed", False),  # the resumed run fires the epoch's end again
        (Events.ITERATION_COMPLETED(every=2), "iteration_completed", False),  # made up at the resumed run's STARTED
        (Events.ITERATION_COMPLETED(once=4), "iteration_completed", True),
    ],
)
def test_an_evaluation_cut_short_by_a_preemption_is_made_up_once_by_the_resumed_run(
    tmp_path, schedule, event, only_at_4
):
    straight, _, _ = preempted_run(tmp_path / "straight", None, schedule)
    straight.run([0, 0], max_epochs=3)
    trainer, evaluations, saver = preempted_run(tmp_path / "preempted", 4, schedule)
    assert trainer.run([0, 0], max_epochs=3).iteration == 4
    # the cut evaluation left no numbers: it is owed, and saved so with the trainer
    before = [] if only_at_4 else [(2, {"mean": 2.0})]
    assert evaluations["val"].history == before
    assert trainer.state.metrics == ({"val/mean": 2.0} if before else {})
    assert evaluations["val"].owed == (4, event)
    resumed, again, saver = preempted_run(tmp_path / "preempted", None, schedule)
    saver.load_objects({"trainer": resumed}, saver.store.latest())
    assert resumed.state.metrics == trainer.state.metrics  # what was published comes back with the trainer
    assert resumed.run([0, 0]).iteration == 6
    made_up = [(4, {"mean": 4.0})] + ([] if only_at_4 else [(6, {"mean": 6.0})])
    assert again["val"].history == made_up  # the cut evaluation, whole, at its own step, then the next
    assert again["val"].owed is None
    assert records(tmp_path / "preempted" / "metrics.jsonl") == records(tmp_path / "straight" / "metrics.jsonl")
    assert [r["step"] for r in records(tmp_path / "straight" / "metrics.jsonl")] == [s for s, _ in before + made_up]


@pytest.mark.parametrize(
    ("schedule", "event"),
    [
        (Events.EPOCH_COMPLETED, "epoch_completed"),  # made up at the EPOCH_COMPLETED the resumed run fires again
        (Events.ITERATION_COMPLETED(every=2), "iteration_completed"),  # made up at the resumed run's STARTED
    ],
)
def test_a_second_sigterm_during_the_made_up_evaluation_stops_untrained_and_the_next_run_makes_it_up(
    tmp_path, schedule, event
):
    """The relaunch is stopped again as it makes the evaluation up: saved at the same step, nothing trained, owed."""
    straight, _, _ = preempted_run(tmp_path / "straight", None, schedule)
    straight.run([0, 0], max_epochs=3)
    first, _, saver = preempted_run(tmp_path / "preempted", 4, schedule)
    assert first.run([0, 0], max_epochs=3).iteration == 4
    second, evaluations, saver = preempted_run(tmp_path / "preempted", 4, schedule)  # the signal in the make-up
    saver.load_objects({"trainer": second}, saver.store.latest())
    assert second.run([0, 0]).iteration == 4  # not one iteration trained
    assert second.preemption.saved.step == 4
    assert (evaluations["val"].history, evaluations["val"].owed) == ([], (4, event))
    assert [c.path.name for c in saver.store.checkpoints()] == ["step_00000004"]  # the same one, its states rewritten
    third, again, saver = preempted_run(tmp_path / "preempted", None, schedule)
    saver.load_objects({"trainer": third}, saver.store.latest())
    assert third.run([0, 0]).iteration == 6
    assert again["val"].history == [(4, {"mean": 4.0}), (6, {"mean": 6.0})]
    assert records(tmp_path / "preempted" / "metrics.jsonl") == records(tmp_path / "straight" / "metrics.jsonl")
