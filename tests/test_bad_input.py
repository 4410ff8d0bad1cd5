"""Bad input, each caught early with an error that names what was expected and what was given."""

import re

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ember import Engine, Events
from ember.cli import ConfigError, load_config
from ember.data import ArrayDataset
from ember.handlers import Checkpoint, NonFiniteError, TerminateOnNan, load_objects
from ember.metrics import Accuracy
from ember.training import TrainState, create_trainer
from ember.training._placement import check_divisible


def linear(width: int = 3):
    state = TrainState.create(lambda p, x: x @ p, jnp.zeros((width,)), optax.sgd(0.1))
    return create_trainer(state, lambda m, b: jnp.mean(m(b) ** 2))


def test_a_batch_that_differs_from_the_first():
    with pytest.raises(ValueError, match=r"^This batch differs from the first one") as info:
        linear().run([np.ones((2, 3), np.float32), np.ones((2, 3), np.int32)])
    assert str(info.value) == (
        "This batch differs from the first one, so the compiled step cannot take it.\n"
        "  first batch: PyTreeDef(*) with leaves [float32[2, 3]]\n"
        "  this batch:  PyTreeDef(*) with leaves [int32[2, 3]]\n"
        "  first difference: the batch: expected float32[2, 3], got int32[2, 3]\n"
        "Give every batch the same structure, shapes and dtypes (drop_remainder=True drops a short last batch)."
    )


def test_a_loader_whose_batches_change_mid_run_names_the_first_differing_leaf():
    def trainer():
        return create_trainer(
            TrainState.create(lambda p, x: x @ p, jnp.zeros((3,)), optax.sgd(0.1)),
            lambda m, b: jnp.mean(m(b["x"]) ** 2) + b["w"].sum(),
        )

    batches = [
        {"x": np.ones((2, 3), np.float32), "w": np.ones((2,), np.float32)},
        {"x": np.ones((2, 3), np.float32), "w": np.ones((4,), np.float32)},
    ]
    with pytest.raises(ValueError, match=re.escape("  first difference: ['w']: expected float32[2], got float32[4]\n")):
        trainer().run(batches)
    with pytest.raises(ValueError, match=re.escape("  first difference: ['z'] is new (got float32[2])\n")):
        trainer().run([batches[0], {**batches[0], "z": np.ones((2,), np.float32)}])


def test_a_batch_that_cannot_be_split_over_the_devices():
    with pytest.raises(ValueError, match=re.escape("A batch of size 12 cannot be split over 8 devices")):
        check_divisible(np.zeros((12, 3)), 8)  # what every placement runs on each batch


def test_nan_in_the_input_stops_or_raises():
    trainer = linear()
    TerminateOnNan(action="raise").attach(trainer)
    with pytest.raises(NonFiniteError, match=re.escape("A NaN or infinite output at iteration 2")):
        trainer.run([np.ones((2, 3), np.float32), np.full((2, 3), np.nan, np.float32), np.ones((2, 3), np.float32)])


def test_an_empty_dataset():
    with pytest.raises(ValueError, match=re.escape("`arrays` hold 0 examples; an empty dataset has no batches")):
        ArrayDataset({"x": np.zeros((0, 3))}, batch_size=2)
    with pytest.raises(ValueError, match=re.escape("`data` is empty; pass at least one batch.")):
        Engine(lambda e, b: b).run([])


def test_a_handler_with_the_wrong_signature():
    with pytest.raises(TypeError, match=re.escape("cannot be called on Events.ITERATION_COMPLETED: it will receive")):
        Engine(lambda e, b: b).add_event_handler(Events.ITERATION_COMPLETED, lambda a, b, c: None)


def test_invalid_filter_arguments():
    with pytest.raises(ValueError, match=re.escape("`every` must be a positive int, got 0.")):
        Events.ITERATION_COMPLETED(every=0)


def test_a_checkpoint_from_a_different_model(tmp_path):
    small = linear(3)
    small.run([np.ones((2, 3), np.float32)])
    Checkpoint({"trainer": small}, tmp_path).save_now(small)
    with pytest.raises(ValueError, match=r"The checkpoint does not fit the target \(\d+ differences\)") as info:
        load_objects({"trainer": linear(4)}, tmp_path)
    assert "trainer/params: the checkpoint has float32[3], the target float32[4]" in str(info.value)


def test_a_config_typo():
    with pytest.raises(ConfigError, match=re.escape("trainer.max_epoch: unknown field; did you mean 'max_epochs'?")):
        load_config({"trainer": {"max_epoch": 3}})


def test_a_metric_computed_before_any_update():
    message = "Metric `Accuracy` was computed before any update; attach it to an engine or call `update` first."
    with pytest.raises(RuntimeError, match=re.escape(message)):
        Accuracy().compute()
