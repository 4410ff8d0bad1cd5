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
    """Handlers may add attributes; repr is Ignite's: numbers and strings as they are, other values' types."""
    state = Engine(lambda e, b: 0.5).run([1, 2], max_epochs=2)
    state.best = 0.1  # type: ignore[attr-defined]
    assert state.best == 0.1  # type: ignore[attr-defined]
    assert repr(state) == (  # Ignite 0.5.5's layout (its State has a seed ember does not)
        "State:\n\titeration: 4\n\tepoch: 2\n\tepoch_length: 2\n\tmax_epochs: 2\n\tmax_iters: <class 'NoneType'>\n"
        "\toutput: 0.5\n\tbatch: 2\n\tmetrics: <class 'dict'>\n\tdataloader: <class 'list'>\n\ttimes: <class 'dict'>\n"
        "\tbest: 0.1\n"
    )
