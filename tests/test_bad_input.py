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
from ember.training._devices.placement import check_divisible


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
    with pytest.raises(ValueError, match=re.escape("cannot be called on Events.ITERATION_COMPLETED: it will receive")):
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


# The scale path's newer APIs (each refused early, naming what was given).


def test_a_batch_whose_dtype_changes_mid_run_is_refused_though_jax_would_convert_it():
    """float32, then float64 (JAX would make it float32 silently, with the same compiled step): refused, named."""
    with pytest.raises(ValueError, match=r"^This batch differs from the first one: the batch is float64") as info:
        linear().run([np.ones((2, 3), np.float32), np.ones((2, 3), np.float64)])
    assert str(info.value) == (
        "This batch differs from the first one: the batch is float64[2, 3], the first batch's was float32. JAX "
        "would convert it silently and train on; give every batch the same dtypes (a transform returning float64 "
        "where it returned float32, say)."
    )
    batch = {"x": np.ones((2, 3), np.float32), "y": np.ones((2,), np.int32)}
    trainer = create_trainer(
        TrainState.create(lambda p, x: x @ p, jnp.zeros((3,)), optax.sgd(0.1)),
        lambda m, b: jnp.mean(m(b["x"]) ** 2) + b["y"].sum(),
    )
    with pytest.raises(ValueError, match=re.escape("['y'] is int64[2], the first batch's was int32.")):
        trainer.run([batch, batch, {**batch, "y": np.ones((2,), np.int64)}])


def test_a_short_last_batch_under_steps_per_call_names_drop_remainder():
    """K=2 with 4, 4, 4, 3: the group holding the short batch is refused before compiling, naming the fix."""
    state = TrainState.create(lambda p, x: x @ p, jnp.zeros((3,)), optax.sgd(0.1))
    trainer = create_trainer(state, lambda m, b: jnp.mean(m(b) ** 2), steps_per_call=2)
    data = [np.ones((4, 3), np.float32)] * 3 + [np.ones((3, 3), np.float32)]
    with pytest.raises(ValueError, match=re.escape("(drop_remainder=True drops a short last batch)")) as info:
        trainer.run(data)
    assert "first difference: the batch: expected float32[4, 3], got float32[3, 3]" in str(info.value)


def test_checkpoint_arguments_and_scores_name_themselves(tmp_path):
    """n_saved=0 names n_saved; a score that is not a number names score_function and what it returned."""
    trainer = Engine(lambda e, b: b)
    with pytest.raises(ValueError, match=r"^`n_saved` must be") as info:
        Checkpoint({"trainer": trainer}, tmp_path, n_saved=0)
    assert str(info.value) == "`n_saved` must be a positive int or None (keep every checkpoint), got 0."
    for value, shown in (
        ("0.93", "'0.93' of type str"),
        (None, "None of type NoneType"),
        ([0.9], "[0.9] of type list"),
    ):
        saver = Checkpoint({"trainer": trainer}, tmp_path, score_function=lambda e, v=value: v)
        with pytest.raises(ValueError, match=r"^`score_function` must return a number") as info:
            saver(trainer)
        assert str(info.value) == f"`score_function` must return a number (a float, or a 0-d array), got {shown}."


def test_the_optimizer_wrappers_are_checked_when_the_evaluator_or_the_plateau_is_made():
    """use_ema without ema(tx), ReduceLROnPlateau without scale_by_plateau(tx): refused at construction."""
    from ember.training import ReduceLROnPlateau, create_evaluator

    trainer = linear()
    with pytest.raises(ValueError, match=r"^use_ema / ema_params need") as info:
        create_evaluator(trainer, lambda m, b: m(b), use_ema=True)
    assert str(info.value) == (
        "use_ema / ema_params need the train state's optimizer wrapped once in ember.training.ema(tx, ...); its "
        "optimizer state holds 0 such averages."
    )
    with pytest.raises(ValueError, match=r"^ReduceLROnPlateau needs") as info:
        ReduceLROnPlateau(trainer, "loss")
    assert str(info.value) == (
        "ReduceLROnPlateau needs the trainer's optimizer wrapped once in ember.training.scale_by_plateau(tx); its "
        "optimizer state holds 0 such scales."
    )


def test_a_grain_transform_that_changes_an_examples_shape_names_the_record():
    """Record 13 comes out 3 long where the others are 4: a RecordError naming it and both shapes."""
    from ember.data import GrainPipeline
    from ember.errors import RecordError

    def odd_one(x):
        return {"x": np.zeros(3 if x == 13 else 4, np.float32)}

    with pytest.raises(RecordError) as info:
        list(GrainPipeline(list(range(40)), batch_size=8, transforms=[odd_one]))
    assert str(info.value) == (
        "record 13 of [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, "
        "26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39] gives PyTreeDef({'x': *}) with leaves [float32[3]] "
        "after its transforms, where record 0 gave PyTreeDef({'x': *}) with leaves [float32[4]]: every example must "
        "have one structure, shapes and dtypes (a batch stacks them)."
    )


@pytest.mark.parametrize(("writer", "reader"), [("CheckpointStore", "OrbaxStore"), ("OrbaxStore", "CheckpointStore")])
def test_a_store_over_another_stores_checkpoints_refuses_to_resume(tmp_path, writer, reader):
    """Resuming with the wrong store is refused, naming the one that wrote them (it started from step 0 before)."""
    import ember.checkpoint as ckpt

    written = getattr(ckpt, writer)(tmp_path)
    written.save({"w": np.ones(2, np.float32)}, step=3)
    getattr(written, "close", lambda: None)()
    store = getattr(ckpt, reader)(tmp_path)
    with pytest.raises(ValueError, match="cannot be restored") as info:
        Checkpoint({"trainer": Engine(lambda e, b: b)}, store).resume()
    message = str(info.value)
    assert message.startswith(
        f"Checkpoint '{tmp_path / 'step_00000003'}' cannot be restored: it was written by {writer}"
    )
    assert message.endswith(
        f"and {reader} cannot read it; open the folder with {writer} (ember.checkpoint.open_store picks it)."
    )
    if writer == "CheckpointStore":
        assert "(its manifest lists the files ['state.msgpack'])" in message
    getattr(store, "close", lambda: None)()


def test_an_empty_config_file_is_refused(tmp_path):
    """An empty YAML file does not train the built-in example: it is named, with the way to get that run."""
    empty = tmp_path / "config.yaml"
    empty.write_text("# nothing yet\n")
    with pytest.raises(ConfigError) as info:
        load_config(empty)
    assert str(info.value) == (
        f"{empty} is empty. Write the fields to change (see `ember train --help` and the CLI page), or leave the file "
        "out to train the built-in example."
    )
