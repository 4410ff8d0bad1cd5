from ember import Engine, State


def test_a_new_state_is_empty():
    """A fresh State has zero counters, no limits and empty metrics."""
    state = State()
    assert (state.iteration, state.epoch, state.epoch_length, state.max_epochs, state.max_iters) == (
        0,
        0,
        None,
        None,
        None,
    )
    assert (state.output, state.batch, state.dataloader, state.metrics) == (None, None, None, {})
    assert state.times == {"EPOCH_COMPLETED": None, "COMPLETED": None}


def test_state_accepts_user_attributes_and_prints_its_counters():
    """Handlers may add attributes; repr shows the counters and the output's type."""
    state = Engine(lambda e, b: 0.5).run([1, 2], max_epochs=2)
    state.best = 0.1  # type: ignore[attr-defined]
    assert state.best == 0.1  # type: ignore[attr-defined]
    assert repr(state) == (
        "State(iteration=4, epoch=2, epoch_length=2, max_epochs=2, max_iters=None, output=float, metrics={})"
    )
