import re
from collections.abc import Iterator
from typing import Any

import pytest

from ember import Engine, Events
from tests.engine.recording import batches_seen


class Positioned:
    """A re-iterable whose iterators report and restore their position (Grain's protocol) and count fetches."""

    def __init__(self, items: list[str]) -> None:
        self.items = items
        self.fetched = 0
        self.closed: list[int] = []  # the position of each iterator closed

    def __iter__(self) -> Iterator[str]:
        return _Cursor(self)


class _Cursor(Iterator[str]):
    def __init__(self, data: Positioned) -> None:
        self.data, self.pos = data, 0

    def __next__(self) -> str:
        if self.pos >= len(self.data.items):
            raise StopIteration
        self.pos += 1
        self.data.fetched += 1
        return self.data.items[self.pos - 1]

    def get_state(self) -> dict[str, int]:
        return {"pos": self.pos}

    def set_state(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]

    def close(self) -> None:
        self.data.closed.append(self.pos)


def test_state_dict_holds_ignite_keys():
    """state_dict() holds epoch_length, iteration and max_epochs, or max_iters for a max_iters run."""
    engine = Engine(lambda e, b: b)
    engine.run([1, 2, 3], max_epochs=2)
    assert engine.state_dict() == {"epoch_length": 3, "iteration": 6, "max_epochs": 2}
    engine.state.max_epochs = None
    engine.run([1, 2, 3], max_iters=4)
    assert engine.state_dict() == {"epoch_length": 3, "iteration": 4, "max_iters": 4}


def test_state_dict_user_keys_are_saved_and_restored():
    """Attributes named in state_dict_user_keys travel through the state dict."""
    engine = Engine(lambda e, b: b)
    engine.state_dict_user_keys.append("alpha")
    engine.state.alpha = 0.5  # type: ignore[attr-defined]
    sd = engine.state_dict()
    assert sd["alpha"] == 0.5
    other = Engine(lambda e, b: b)
    other.state_dict_user_keys.append("alpha")
    other.load_state_dict({**sd, "epoch_length": 3, "max_epochs": 2})
    assert other.state.alpha == 0.5  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"missing the user keys \['alpha'\]"):
        other.load_state_dict({"epoch_length": 3, "iteration": 0, "max_epochs": 2})
    bare = Engine(lambda e, b: b)
    bare.state_dict_user_keys.append("beta")
    with pytest.raises(AttributeError, match=r"`state_dict_user_keys` names 'beta', but engine.state has no"):
        bare.state_dict()


def test_mid_epoch_resume_delivers_the_batch_an_uninterrupted_run_would():
    """After load_state_dict(iteration=5, epoch_length=3), run(['a','b','c']) processes 'c' at iteration 6."""
    engine = Engine(lambda e, b: b)
    seen = batches_seen(engine)
    engine.load_state_dict({"iteration": 5, "epoch_length": 3, "max_epochs": 3})
    assert (engine.state.epoch, engine.state.iteration) == (2, 5)
    engine.run(["a", "b", "c"])
    assert seen == [(2, 6, "c"), (3, 7, "a"), (3, 8, "b"), (3, 9, "c")]


def test_resume_does_not_start_the_continued_epoch_again():
    """A resumed mid-epoch run fires STARTED but not EPOCH_STARTED for the epoch it continues."""
    engine = Engine(lambda e, b: b)
    starts = []
    engine.add_event_handler(Events.EPOCH_STARTED, lambda e: starts.append(e.state.epoch))
    engine.add_event_handler(Events.STARTED, lambda e: starts.append("run"))
    engine.load_state_dict({"iteration": 4, "epoch_length": 3, "max_epochs": 3})
    engine.run([1, 2, 3])
    assert starts == ["run", 3]


def test_resume_at_an_epoch_boundary_starts_the_next_epoch():
    """load_state_dict with 'epoch' resumes at the start of the following epoch."""
    engine = Engine(lambda e, b: b)
    seen = batches_seen(engine)
    engine.load_state_dict({"epoch": 1, "epoch_length": 2, "max_epochs": 2})
    assert (engine.state.epoch, engine.state.iteration) == (1, 2)
    engine.run(["x", "y"])
    assert seen == [(2, 3, "x"), (2, 4, "y")]


def test_data_with_its_own_position_is_restored_not_skipped():
    """An iterator with get_state/set_state is restored from the state dict, without fetching skipped batches."""
    data = Positioned(["a", "b", "c", "d"])
    first = Engine(lambda e, b: b)
    first.add_event_handler(Events.ITERATION_COMPLETED(once=6), lambda e: e.terminate(final=False))
    first.run(data, max_epochs=2)
    assert data.closed == [2]  # the run stopped: the iterator was closed, its position kept
    sd = first.state_dict()
    assert sd == {"epoch_length": 4, "iteration": 6, "max_epochs": 2, "data": {"pos": 2}}

    fresh = Positioned(["a", "b", "c", "d"])
    second = Engine(lambda e, b: b)
    seen = batches_seen(second)
    second.load_state_dict(sd)
    second.run(fresh)
    assert [b for _, _, b in seen] == ["c", "d"]
    assert fresh.fetched == 2
    assert fresh.closed == [4]  # closed at COMPLETED


def test_a_stopped_run_reopens_its_data_where_it_stood():
    """terminate() closes the iterator (its workers stop); run() again reopens the data at the kept position."""
    data = Positioned(["a", "b", "c"])
    engine = Engine(lambda e, b: b)
    seen = batches_seen(engine)
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=2), lambda e: e.terminate())
    engine.run(data, max_epochs=2)
    assert data.closed == [2]
    engine.run(data)
    assert [b for _, _, b in seen] == ["a", "b", "c", "a", "b", "c"]
    assert data.closed == [2, 3]
    assert data.fetched == 6


def test_a_saved_position_needs_data_that_can_take_it():
    """Resuming a position saved from positioned data onto a plain list is an error, not a silent restart."""
    engine = Engine(lambda e, b: b)
    engine.load_state_dict({"epoch_length": 4, "iteration": 2, "max_epochs": 1, "data": {"pos": 2}})
    with pytest.raises(
        ValueError, match=r"holds a saved position in its data, but the iterator of this data \(list_iterator\) has no"
    ):
        engine.run(["a", "b", "c", "d"])


def test_resume_straight_equals_uninterrupted_run():
    """Stopping at every iteration and resuming from the state dict reproduces the uninterrupted batches."""
    data = list(range(5))
    straight = Engine(lambda e, b: b)
    expected = batches_seen(straight)
    straight.run(data, max_epochs=3)
    for stop in range(1, 15):
        first = Engine(lambda e, b: b)
        got = batches_seen(first)
        first.add_event_handler(Events.ITERATION_COMPLETED(once=stop), lambda e: e.terminate(final=False))
        first.run(data, max_epochs=3)
        second = Engine(lambda e, b: b)
        second.add_event_handler(
            Events.ITERATION_COMPLETED, lambda e, got=got: got.append((e.state.epoch, e.state.iteration, e.state.batch))
        )
        second.load_state_dict(first.state_dict())
        second.run(data)
        assert got == expected, f"stopped at {stop}"


def test_resume_skipping_past_short_data_fails_clearly():
    """Resuming beyond what the given data holds raises, naming the position."""
    engine = Engine(lambda e, b: b)
    engine.load_state_dict({"iteration": 4, "epoch_length": 5, "max_epochs": 2})
    with pytest.raises(ValueError, match=r"Cannot resume at iteration 4 of epoch 1: the data ran out after 2 batches"):
        engine.run(iter([1, 2]))


def test_run_with_different_data_after_terminate_starts_that_data_from_its_beginning():
    """New data given to a continued run replaces the live iterator, like set_data."""
    engine = Engine(lambda e, b: b)
    seen = batches_seen(engine)
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=2), lambda e: e.terminate())
    engine.run([1, 2, 3], max_epochs=1)
    engine.run(["x", "y", "z"])
    assert [b for _, _, b in seen] == [1, 2, "x"]


@pytest.mark.parametrize(
    ("sd", "error", "match"),
    [
        ([("iteration", 1)], TypeError, r"`state_dict` must be a mapping, got list"),
        ({"iteration": 1, "max_epochs": 2}, ValueError, r"missing the required key 'epoch_length'"),
        ({"epoch_length": 3, "max_epochs": 2}, ValueError, r"exactly one of 'iteration' and 'epoch'"),
        ({"epoch_length": 3, "iteration": 1, "epoch": 1, "max_epochs": 2}, ValueError, r"exactly one of 'iteration'"),
        ({"epoch_length": 3, "iteration": 1}, ValueError, r"exactly one of 'max_epochs' and 'max_iters'"),
        (
            {"epoch_length": 3, "iteration": 1, "max_epochs": 2, "max_iters": 6},
            ValueError,
            r"exactly one of 'max_epochs' and 'max_iters'",
        ),
        ({"epoch_length": 3, "iteration": 7, "max_epochs": 2}, ValueError, r"iteration 7, past its end at iteration 6"),
        ({"epoch_length": 3, "iteration": 5, "max_iters": 4}, ValueError, r"iteration 5, past its end at iteration 4"),
        ({"epoch_length": 3, "iteration": -1, "max_epochs": 2}, ValueError, r"must be a non-negative int, got -1"),
        ({"epoch_length": 0, "iteration": 0, "max_epochs": 2}, ValueError, r"'epoch_length'\]` must be a positive int"),
        ({"epoch_length": None, "epoch": 1, "max_epochs": 2}, ValueError, r"gives 'epoch' but 'epoch_length' is None"),
        ({"epoch_length": None, "iteration": 3, "max_epochs": 2}, ValueError, r"'epoch_length' is None; the engine"),
    ],
)
def test_load_state_dict_validates_like_ignite(sd: Any, error: type[Exception], match: str):
    """Malformed state dicts are refused with an error naming the problem, and the state is untouched."""
    engine = Engine(lambda e, b: b)
    with pytest.raises(error, match=match):
        engine.load_state_dict(sd)
    assert (engine.state.iteration, engine.state.max_epochs) == (0, None)


def test_load_state_dict_with_max_iters_leaves_max_epochs_none():
    """A max_iters state dict leaves max_epochs None (Ignite's load_state_dict), and the run stops at max_iters."""
    engine = Engine(lambda e, b: b)
    engine.load_state_dict({"epoch_length": 3, "iteration": 2, "max_iters": 7})
    assert (engine.state.max_epochs, engine.state.max_iters) == (None, 7)
    assert engine.run([1, 2, 3]).iteration == 7


def _epoch_events(engine: Engine) -> list[Any]:
    seen: list[Any] = []
    engine.add_event_handler(Events.EPOCH_STARTED, lambda e: seen.append(("EPOCH_STARTED", e.state.epoch)))
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(e.state.iteration))
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: seen.append(("EPOCH_COMPLETED", e.state.epoch)))
    return seen


def test_terminate_at_an_epochs_last_iteration_owes_its_epoch_completed():
    """Stopped at epoch 1's last iteration, a continued or resumed run fires its EPOCH_COMPLETED first."""
    first = Engine(lambda e, b: b)
    saved: list[Any] = []
    first.add_event_handler(Events.ITERATION_COMPLETED(once=2), lambda e: (saved.append(e.state_dict()), e.terminate()))
    seen = _epoch_events(first)
    first.run(["a", "b"], max_epochs=2)
    assert saved == [{"epoch_length": 2, "iteration": 2, "max_epochs": 2, "epoch_completed": False}]
    assert seen == [("EPOCH_STARTED", 1), 1, 2]
    first.run(["a", "b"])
    assert seen[3:] == [("EPOCH_COMPLETED", 1), ("EPOCH_STARTED", 2), 3, 4, ("EPOCH_COMPLETED", 2)]

    resumed = Engine(lambda e, b: b)
    seen = _epoch_events(resumed)
    resumed.load_state_dict(saved[0])
    assert (resumed.state.epoch, resumed.state.iteration) == (1, 2)
    resumed.run(["a", "b"])
    assert seen == [("EPOCH_COMPLETED", 1), ("EPOCH_STARTED", 2), 3, 4, ("EPOCH_COMPLETED", 2)]


def test_terminate_at_the_runs_last_iteration_still_owes_the_last_epoch_completed():
    engine = Engine(lambda e, b: b)
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=4), lambda e: e.terminate())
    seen = _epoch_events(engine)
    engine.run(["a", "b"], max_epochs=2)
    assert seen[-1] == 4
    engine.run(["a", "b"])
    assert seen[-1] == ("EPOCH_COMPLETED", 2)
    assert engine.state_dict() == {"epoch_length": 2, "iteration": 4, "max_epochs": 2}


def batches_run(engine: Engine, data: Any, **run_kwargs: Any) -> list[Any]:
    """Run ``engine`` over ``data``; return the batches its steps got."""
    seen: list[Any] = []
    handle = engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(e.state.batch))
    engine.run(data, **run_kwargs)
    handle.remove()
    return seen


ALREADY_COMPLETE = (
    "The run loaded by load_state_dict() is already complete (epoch 2 of 2, iteration 6); run() does nothing. "
    "Pass a larger max_epochs (or max_iters) to train further, or set engine.state.max_epochs = None to restart "
    "from zero."
)


def finished_state() -> dict[str, Any]:
    done = Engine(lambda e, b: b)
    done.run([1, 2, 3], max_epochs=2)
    return done.state_dict()


def test_a_loaded_finished_run_fires_nothing_and_says_so():
    """run() after loading a complete run's state fires no event, warns with the position, and stays complete."""
    engine = Engine(lambda e, b: b)
    fired: list[str] = []
    for event in Events:
        engine.add_event_handler(event, lambda e, event=event: fired.append(event.name))
    engine.load_state_dict(finished_state())
    with pytest.warns(UserWarning, match=re.escape(ALREADY_COMPLETE)):
        state = engine.run([1, 2, 3], max_epochs=2)
    assert (fired, state.iteration, state.epoch) == ([], 6, 2)
    with pytest.warns(UserWarning, match=re.escape(ALREADY_COMPLETE)):  # and again on every relaunch
        assert list(engine.iterate([1, 2, 3], Events.ITERATION_COMPLETED, max_epochs=2)) == []
    assert fired == []


def test_a_loaded_finished_run_given_more_epochs_trains_only_those():
    """A larger max_epochs continues from the end of the loaded run."""
    engine = Engine(lambda e, b: b)
    engine.load_state_dict(finished_state())
    assert batches_run(engine, [1, 2, 3], max_epochs=3) == [1, 2, 3]
    assert (engine.state.iteration, engine.state.epoch) == (9, 3)


def test_a_loaded_finished_run_restarts_from_zero_when_asked():
    """Setting state.max_epochs to None starts a new run, as the warning says."""
    engine = Engine(lambda e, b: b)
    engine.load_state_dict(finished_state())
    engine.state.max_epochs = None
    assert batches_run(engine, [1, 2, 3], max_epochs=1) == [1, 2, 3]


def test_a_run_finished_in_this_process_starts_again_as_in_ignite():
    """Only a loaded finished run is kept complete; run() after an in-process run starts a new run."""
    engine = Engine(lambda e, b: b)
    engine.run([1, 2, 3], max_epochs=2)
    assert batches_run(engine, [1, 2, 3], max_epochs=2) == [1, 2, 3, 1, 2, 3]


def test_mark_epoch_incomplete_makes_a_resumed_run_fire_that_epoch_completed_again():
    """A state saved after mark_epoch_incomplete() resumes at that epoch's EPOCH_COMPLETED."""
    engine = Engine(lambda e, b: b)
    saved: list[dict[str, Any]] = []

    @engine.on(Events.EPOCH_COMPLETED(once=1))
    def cut_short(engine):
        engine.mark_epoch_incomplete()
        saved.append(engine.state_dict())
        engine.terminate(final=False)

    engine.run([1, 2], max_epochs=2)
    assert saved == [{"epoch_length": 2, "iteration": 2, "max_epochs": 2, "epoch_completed": False}]
    assert engine.state_dict() == saved[0]  # still owed when the run has stopped there (a save at COMPLETED)
    resumed = Engine(lambda e, b: b)
    events: list[tuple[str, int]] = []
    for event in (Events.EPOCH_COMPLETED, Events.ITERATION_COMPLETED):
        resumed.add_event_handler(event, lambda e, event=event: events.append((event.name, e.state.iteration)))
    resumed.load_state_dict(saved[0])
    resumed.run([1, 2])
    assert events == [
        ("EPOCH_COMPLETED", 2),
        ("ITERATION_COMPLETED", 3),
        ("ITERATION_COMPLETED", 4),
        ("EPOCH_COMPLETED", 4),
    ]


def test_mark_epoch_incomplete_outside_epoch_completed_is_refused():
    """Called from another event it raises, naming the event."""
    engine = Engine(lambda e, b: b)
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: e.mark_epoch_incomplete())
    with pytest.raises(
        RuntimeError,
        match=re.escape(
            "mark_epoch_incomplete() is for EPOCH_COMPLETED handlers; it was called at Events.ITERATION_COMPLETED."
        ),
    ):
        engine.run([1])


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict[str, int]:
        return {"n": self.n}

    def load_state_dict(self, sd: dict[str, int]) -> None:
        self.n = sd["n"]


def test_tracked_states_travel_in_the_engine_state_dict():
    """track_state() adds the object's state; loading restores it, also into an object tracked later."""
    engine, counter = Engine(lambda e, b: b), Counter()
    engine.track_state("counter", counter)
    counter.n = 5
    engine.run([1])
    saved = engine.state_dict()
    assert saved["attached"] == {"counter": {"n": 5}}
    fresh, late = Engine(lambda e, b: b), Counter()
    fresh.load_state_dict(saved)
    fresh.track_state("counter", late)
    assert late.n == 5


def test_track_state_refuses_what_it_cannot_save():
    """An object without state_dict, a second object under one name, and a bad name are refused."""
    engine = Engine(lambda e, b: b)
    with pytest.raises(TypeError, match=re.escape("`obj` must have state_dict() and load_state_dict(), got int.")):
        engine.track_state("n", 3)
    engine.track_state("c", Counter())
    with pytest.raises(ValueError, match=re.escape("already saves the state of another object as 'c'")):
        engine.track_state("c", Counter())
    with pytest.raises(TypeError, match=re.escape("`name` must be a non-empty string, got ''.")):
        engine.track_state("", Counter())


class Passes:
    """Data that records the passes an engine asks for with set_epoch."""

    def __init__(self, n: int) -> None:
        self.n, self.asked = n, []
        self._next = 0

    def set_epoch(self, epoch: int) -> None:
        self.asked.append(epoch)
        self._next = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch, self._next = self._next, self._next + 1
        return iter([(epoch, i) for i in range(self.n)])


def test_each_new_pass_is_numbered_from_the_engines_own_position():
    """set_epoch gets the number of whole passes before the next batch, also when epochs and passes differ."""
    data = Passes(3)
    engine = Engine(lambda e, b: b)
    assert batches_run(engine, data, max_epochs=2, epoch_length=2) == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert data.asked == [0, 1]
    resumed_data = Passes(3)
    resumed = Engine(lambda e, b: b)
    resumed.load_state_dict({"iteration": 2, "epoch_length": 2, "max_epochs": 3})
    assert batches_run(resumed, resumed_data) == [(0, 2), (1, 0), (1, 1), (1, 2)]  # skipped through pass 0
    assert resumed_data.asked == [0, 1]


def test_a_fresh_engines_state_dict_loads_into_a_fresh_engine():
    """The round trip of an engine that never ran is accepted, as in Ignite, and leaves a fresh engine."""
    fresh = Engine(lambda e, b: b)
    fresh.load_state_dict(Engine(lambda e, b: b).state_dict())
    assert batches_run(fresh, [1, 2], max_epochs=1) == [1, 2]
