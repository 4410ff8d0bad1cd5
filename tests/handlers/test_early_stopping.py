import pytest

from ember import Engine, Events
from ember.handlers import EarlyStopping


def scored(scores):
    it = iter(scores)
    return lambda engine: next(it)


def test_patience_two_stops_after_the_third_call():
    """Ignite's numbers: patience 2 with 1.0, 0.8, 0.88 stops on the third call."""
    trainer = Engine(lambda e, b: b)
    stop = EarlyStopping(2, scored([1.0, 0.8, 0.88]), trainer)
    stop(trainer)
    stop(trainer)
    assert not trainer.should_terminate
    stop(trainer)
    assert trainer.should_terminate
    assert stop.state_dict() == {"counter": 2, "best_score": 1.0}


def test_evaluator_scores_stop_a_ten_epoch_trainer_at_epoch_seven():
    """Ignite's scenario: evaluator scores 1.0, 0.8, 1.2, 1.5, 0.9, 1.0, 0.99, 1.1, 0.9 with patience 3."""
    trainer = Engine(lambda e, b: b)
    evaluator = Engine(lambda e, b: b)
    scores = iter([1.0, 0.8, 1.2, 1.5, 0.9, 1.0, 0.99, 1.1, 0.9])
    evaluator.add_event_handler(Events.COMPLETED, lambda e: e.state.metrics.update(score=next(scores)))
    EarlyStopping(3, lambda e: e.state.metrics["score"], trainer).attach(evaluator)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: evaluator.run([0]))
    assert trainer.run([0, 0], max_epochs=10).epoch == 7


@pytest.mark.parametrize(
    ("kwargs", "scores", "calls_until_stop"),
    [
        ({"threshold": 0.1}, [1.0, 1.05, 1.15, 1.2], 3),  # 1.15 is not 0.1 over the best, 1.05
        ({"threshold": 0.1, "cumulative": True}, [1.0, 1.05, 1.15, 1.2], None),  # 1.15 is over 1.0 + 0.1
        ({"mode": "min"}, [1.0, 0.9, 0.95, 0.99], 4),
        ({"threshold": 0.1, "threshold_mode": "rel"}, [1.0, 1.05, 1.12, 1.2], 3),  # 1.12 is under 1.05 * 1.1
        ({"threshold": 0.1, "threshold_mode": "rel", "mode": "min"}, [1.0, 0.85, 0.8, 0.75], 4),  # 0.75 > 0.8 * 0.9
    ],
)
def test_threshold_cumulative_relative_and_min_mode(kwargs, scores, calls_until_stop):
    """Ignite 0.5.5's rule, case by case."""
    trainer = Engine(lambda e, b: b)
    stop = EarlyStopping(2, scored(scores), trainer, **kwargs)
    stopped_at = None
    for call in range(1, len(scores) + 1):
        stop(trainer)
        if trainer.should_terminate and stopped_at is None:
            stopped_at = call
    assert stopped_at == calls_until_stop


def test_state_dict_round_trip_continues_the_count():
    """A restored handler stops exactly when the original would have."""
    trainer = Engine(lambda e, b: b)
    first = EarlyStopping(3, scored([1.0, 0.5, 0.5]), trainer)
    for _ in range(3):
        first(trainer)
    second = EarlyStopping(3, scored([0.7]), trainer)
    second.load_state_dict(first.state_dict())
    second(trainer)
    assert trainer.should_terminate


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"patience": 0}, "`patience` must be an int of at least 1, got 0."),
        ({"threshold": -1.0}, "`threshold` must be a number of at least 0, got -1.0."),
        ({"mode": "up"}, '`mode` must be "min" or "max", got \'up\'.'),
        ({"threshold_mode": "pct"}, '`threshold_mode` must be "abs" or "rel", got \'pct\'.'),
        ({"score_function": 3}, "`score_function` must be callable as score_function(engine), got 3."),
        ({"trainer": "t"}, "`trainer` must be an ember Engine, got str."),
    ],
)
def test_bad_arguments(kwargs, message):
    args = {"patience": 2, "score_function": lambda e: 0.0, "trainer": Engine(lambda e, b: b), **kwargs}
    with pytest.raises((ValueError, TypeError)) as info:
        EarlyStopping(**args)
    assert str(info.value) == message


def test_ignites_keywords_and_its_deprecated_ones():
    """Ignite's keywords work as written; Ignite's deprecated min_delta and cumulative_delta warn as Ignite's do."""
    trainer = Engine(lambda e, b: b)
    stop = EarlyStopping(patience=2, score_function=scored([1.0]), trainer=trainer, threshold=0.1, cumulative=True)
    assert (stop.threshold, stop.cumulative, stop.threshold_mode) == (0.1, True, "abs")
    with pytest.raises(TypeError, match="score_fn"):  # ember's own earlier name, never released
        EarlyStopping(2, score_fn=scored([1.0]), trainer=trainer)  # type: ignore[call-arg]
    with pytest.warns(DeprecationWarning, match=r"^'min_delta' is deprecated .* Please use 'threshold' instead\.$"):
        assert EarlyStopping(2, scored([1.0]), trainer, min_delta=0.2).threshold == 0.2
    with pytest.warns(DeprecationWarning, match=r"^'cumulative_delta' is deprecated .* Please use 'cumulative'"):
        assert EarlyStopping(2, scored([1.0]), trainer, cumulative_delta=True).cumulative is True


def test_load_state_dict_names_missing_keys():
    stop = EarlyStopping(2, lambda e: 0.0, Engine(lambda e, b: b))
    with pytest.raises(KeyError, match=r"lacks \['best_score'\]; got keys \['counter'\]"):
        stop.load_state_dict({"counter": 1})


def ignites_rule(scores, threshold=0.0, threshold_mode="abs", mode="max", cumulative=False):
    """Ignite 0.5.5's EarlyStopping.__call__, written out: the counter after each score (an independent reference)."""
    best, counter, counters = None, 0, []
    for score in scores:
        if best is None:
            best = score
        else:
            step = -threshold if mode == "min" else threshold
            bar = best + step if threshold_mode == "abs" else best * (1 + step)
            if (score <= bar) if mode == "max" else (score >= bar):
                if not cumulative:
                    best = max(score, best) if mode == "max" else min(score, best)
                counter += 1
            else:
                best, counter = score, 0
        counters.append(counter)
    return counters


def counters_of(scores, **kwargs):
    trainer = Engine(lambda e, b: b)
    stop = EarlyStopping(100, scored(scores), trainer, **kwargs)
    out = []
    for _ in scores:
        stop(trainer)
        out.append(stop.counter)
    return out


@pytest.mark.parametrize("mode", ["max", "min"])
def test_a_score_equal_to_the_best_is_not_an_improvement(mode):
    """Ignite's rule: equal to the best (threshold 0) counts as no improvement, in either mode."""
    scores = [1.0, 1.0, 1.0]
    assert counters_of(scores, mode=mode) == [0, 1, 2] == ignites_rule(scores, mode=mode)


@pytest.mark.parametrize(
    ("mode", "scores", "absolute", "relative"),
    [
        ("max", [10.0, 10.5], [0, 0], [0, 1]),  # abs: 10.5 > 10 + 0.1; rel: 10.5 <= 10 x 1.1 = 11
        ("min", [10.0, 9.5], [0, 0], [0, 1]),  # abs: 9.5 < 10 - 0.1; rel: 9.5 >= 10 x 0.9 = 9
        ("max", [10.0, 11.0], [0, 0], [0, 1]),  # rel: exactly at the bar, 10 x 1.1, is not over it
    ],
)
def test_relative_and_absolute_thresholds_differ_where_ignites_do(mode, scores, absolute, relative):
    """Scores far from 1, where threshold=0.1 means 0.1 absolute but 1.0 relative: each mode as Ignite decides."""
    assert counters_of(scores, mode=mode, threshold=0.1) == absolute == ignites_rule(scores, 0.1, "abs", mode)
    assert (
        counters_of(scores, mode=mode, threshold=0.1, threshold_mode="rel")
        == relative
        == ignites_rule(scores, 0.1, "rel", mode)
    )


def test_the_rule_matches_ignites_on_random_scores():
    """200 random sequences, every mode, threshold kind and cumulative flag: the same counters as Ignite's rule."""
    import random

    rng = random.Random(0)
    for _ in range(200):
        scores = [round(rng.uniform(0.5, 20.0), rng.choice([0, 1, 2])) for _ in range(rng.randint(2, 12))]
        kwargs = {
            "threshold": rng.choice([0.0, 0.05, 0.5]),
            "threshold_mode": rng.choice(["abs", "rel"]),
            "mode": rng.choice(["max", "min"]),
            "cumulative": rng.choice([False, True]),
        }
        assert counters_of(scores, **kwargs) == ignites_rule(scores, **kwargs), (scores, kwargs)


def _evaluated_trainer(scores):
    trainer, evaluator = Engine(lambda e, b: b), Engine(lambda e, b: b)
    it = iter(scores)
    evaluator.add_event_handler(Events.COMPLETED, lambda e: e.state.metrics.update(score=next(it)))
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: evaluator.run([0]))
    return trainer, evaluator


def test_attach_resets_at_the_start_of_each_new_run_of_the_trainer():
    """Ignite 0.5.4's attach registers reset() at STARTED: a second run starts with the patience whole."""
    trainer, evaluator = _evaluated_trainer([1.0, 0.9, 0.8, 2.0, 1.9, 1.8, 1.7])
    stop = EarlyStopping(2, lambda e: e.state.metrics["score"], trainer)
    stop.attach(evaluator)
    assert trainer.run([0], max_epochs=10).epoch == 3
    trainer.state.max_epochs = None  # a new run from iteration 0
    assert trainer.run([0], max_epochs=10).epoch == 3  # 2.0 is its first best, not compared with the old 1.0
    assert stop.state_dict() == {"counter": 2, "best_score": 2.0}


def test_reset_engine_and_reset_event_pick_where_the_count_restarts():
    """reset_event=EPOCH_STARTED on the trainer: the count restarts every epoch, so the run never stops."""
    trainer, evaluator = _evaluated_trainer([1.0, 0.9, 0.8, 0.7, 0.6])
    stop = EarlyStopping(2, lambda e: e.state.metrics["score"], trainer)
    stop.attach(evaluator, reset_engine=trainer, reset_event=Events.EPOCH_STARTED)
    assert trainer.run([0], max_epochs=5).epoch == 5
    trainer, evaluator = _evaluated_trainer([1.0, 0.9, 0.8, 0.7, 0.6])
    stop = EarlyStopping(2, lambda e: e.state.metrics["score"], trainer)
    stop.attach(evaluator, reset_engine=evaluator)  # Ignite's default: reset at each evaluation, never stopping
    assert trainer.run([0], max_epochs=5).epoch == 5


def test_a_resumed_run_keeps_the_patience_it_had():
    """A STARTED that continues a run (iteration above 0) keeps the restored count: the run stops where it would."""
    trainer, evaluator = _evaluated_trainer([1.0, 0.9, 0.8])
    stop = EarlyStopping(3, lambda e: e.state.metrics["score"], trainer)
    stop.attach(evaluator)
    trainer.load_state_dict({"epoch_length": 1, "iteration": 4, "max_epochs": 10})
    stop.load_state_dict({"counter": 1, "best_score": 1.5})
    assert trainer.run([0]).epoch == 6  # epochs 5 and 6: two more calls without improvement
    assert stop.state_dict() == {"counter": 3, "best_score": 1.5}


def test_the_reset_handler_is_the_reset_method_itself_as_in_ignite():
    """``has_event_handler(stop.reset)`` finds it and ``remove_event_handler`` removes it (Ignite's own test)."""
    trainer, evaluator = Engine(lambda e, b: b), Engine(lambda e, b: b)
    stop = EarlyStopping(2, lambda e: 0.0, trainer)
    stop.attach(evaluator)
    assert trainer.has_event_handler(stop.reset, Events.STARTED)
    stop.counter = 1
    trainer.remove_event_handler(stop.reset, Events.STARTED)
    assert not trainer.has_event_handler(stop.reset)
    trainer.run([0])
    assert stop.counter == 1  # no reset ran
