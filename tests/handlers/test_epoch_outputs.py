"""EpochOutputStore: Ignite's handler, keeping device outputs without reading them back."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ember import Engine, Events
from ember.handlers import EpochOutputStore
from tests.engine.test_hot_path import Untouchable
from tests.handlers.trainers import DATA, evaluator, trainer


def test_ignites_example_keeps_the_evaluators_outputs_under_a_name():
    """eos.attach(train_evaluator, "output"): after the run, state.output is the epoch's list of outputs."""
    ev = Engine(lambda e, b: (b * 2, b))
    eos = EpochOutputStore()
    eos.attach(ev, "output")
    state = ev.run([1, 2, 3])
    assert state.output == [(2, 1), (4, 2), (6, 3)]
    first = state.output
    ev.run([4])
    assert (ev.state.output, first) == ([(8, 4)], [(2, 1), (4, 2), (6, 3)])  # a new list each epoch


def test_each_epoch_starts_a_new_list_and_without_a_name_nothing_is_stored():
    engine, eos = Engine(lambda e, b: b * 10), EpochOutputStore(output_transform=lambda out: out + 1)
    eos.attach(engine)
    epochs = []
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda: epochs.append(list(eos.data)))
    engine.run([1, 2], max_epochs=2)
    assert epochs == [[11, 21], [11, 21]]
    assert not hasattr(engine.state, "None")
    with pytest.raises(ValueError, match=r"needs a name: attach it with attach\(engine, name=...\)"):
        eos.store(engine)
    with pytest.raises(ValueError, match=r"`name` must be an attribute name for engine.state, got 'a b'"):
        EpochOutputStore().attach(engine, "a b")
    with pytest.raises(TypeError, match=r"`output_transform` must be callable, got 3"):
        EpochOutputStore(3)  # type: ignore[arg-type]


def test_a_real_evaluators_outputs_stay_on_the_device_and_concatenate_to_the_whole_set():
    t = trainer()
    ev = evaluator(t)
    eos = EpochOutputStore(output_transform=lambda out: out["correct"])
    eos.attach(ev, "correct")
    ev.run(DATA[:1])  # compile outside the guard
    with jax.transfer_guard_device_to_host("disallow"):
        ev.run(DATA)
    assert all(isinstance(x, jax.Array) for x in ev.state.correct)
    expected = [float(jnp.mean(jnp.argmax(b["x"] @ jnp.zeros((4, 3)), -1) == b["y"])) for b in DATA]
    np.testing.assert_allclose([float(x) for x in ev.state.correct], expected)
    untouched = Engine(lambda e, b: Untouchable())  # nothing is converted on the way: a stand-in that refuses
    EpochOutputStore().attach(untouched, "outputs")
    assert len(untouched.run([1, 2]).outputs) == 2
