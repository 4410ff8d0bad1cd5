"""The Ignite migration guide's name table, executed: each ember name takes the Ignite arguments its row claims."""

import re
from pathlib import Path

import pytest

from ember import Engine, Events

GUIDE = (Path(__file__).resolve().parents[1] / "docs" / "migrating" / "ignite.md").read_text()


def test_handlers_take_ignites_keywords(tmp_path):
    """The checkpoint, stopping, timing, progress and common handlers, each called with Ignite's keywords."""
    from ember.handlers import (
        Checkpoint,
        DiskSaver,
        EarlyStopping,
        ModelCheckpoint,
        ProgressBar,
        TerminateOnNan,
        TimeLimit,
        Timer,
        global_step_from_engine,
        setup_common_training_handlers,
    )

    trainer, evaluator = Engine(lambda e, b: {"loss": float(b)}), Engine(lambda e, b: b)
    Checkpoint(
        to_save={"trainer": trainer},
        save_handler=DiskSaver(dirname=tmp_path / "a", atomic=True, create_dir=True, require_empty=True),
        filename_prefix="best",
        score_function=lambda engine: 0.5,
        score_name="accuracy",
        n_saved=2,
        global_step_transform=global_step_from_engine(trainer),
    ).attach(evaluator, Events.COMPLETED)
    handler = ModelCheckpoint(
        dirname=tmp_path / "b", filename_prefix="mnist", n_saved=2, require_empty=False, create_dir=True
    )
    trainer.add_event_handler(Events.EPOCH_COMPLETED, handler, {"trainer": trainer})
    EarlyStopping(
        patience=3, score_function=lambda engine: 0.5, trainer=trainer, threshold=0.0, cumulative=False
    ).attach(evaluator)
    trainer.add_event_handler(Events.ITERATION_COMPLETED, TimeLimit(limit_sec=3600))
    trainer.add_event_handler(Events.ITERATION_COMPLETED, TerminateOnNan(output_transform=lambda o: o["loss"]))
    Timer(average=True).attach(trainer, start=Events.EPOCH_STARTED, pause=Events.EPOCH_COMPLETED)
    ProgressBar(persist=False).attach(trainer, metric_names=None, output_transform=lambda o: {"batchloss": o["loss"]})
    handlers = setup_common_training_handlers(
        trainer,
        to_save={"trainer": trainer},
        save_every_iters=2,
        output_path=tmp_path / "c",
        n_saved=1,
        with_pbars=False,
        log_every_iters=1,
        stop_on_nan=True,
    )
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: evaluator.run([0]))
    assert trainer.run([1.0, 2.0], max_epochs=2).iteration == 4
    assert sorted(handlers) == ["checkpoint", "running_average", "terminate_on_nan"]
    info = Checkpoint.load_objects(to_load={"trainer": Engine(lambda e, b: b)}, checkpoint=tmp_path / "b")
    assert info.path.name == "mnist_step_00000004"


def test_metrics_and_trainers_take_ignites_arguments():
    """output_transform returning a list, RunningAverage(alpha=, output_transform=), supervised factories."""
    import jax.numpy as jnp
    import optax
    from flax import linen as nn

    from ember.metrics import Accuracy, Loss, RunningAverage
    from ember.training import create_supervised_evaluator, create_supervised_trainer

    def loss_fn(y_pred, y):
        return optax.softmax_cross_entropy_with_integer_labels(y_pred, y).mean()

    trainer = create_supervised_trainer(nn.Dense(3), optax.sgd(0.1), loss_fn)
    RunningAverage(alpha=0.9, output_transform=lambda out: out["loss"]).attach(trainer, "running_loss")
    evaluator = create_supervised_evaluator(
        trainer,
        metrics={
            "accuracy": Accuracy(output_transform=lambda out: [out["y_pred"], out["y"]]),
            "nll": Loss(loss_fn),
        },
    )
    data = [(jnp.ones((4, 2)), jnp.array([0, 1, 2, 0]))]
    trainer.run(data, max_epochs=2)
    metrics = evaluator.run(data).metrics
    assert sorted(metrics) == ["accuracy", "nll"]


@pytest.mark.parametrize(
    "name",
    [
        "Checkpoint(to_save, save_handler, filename_prefix, score_function, score_name, n_saved, "
        "global_step_transform)",
        "EarlyStopping(patience, score_function, trainer, threshold, cumulative, threshold_mode, mode)",
        "setup_common_training_handlers(trainer, to_save=, save_every_iters=, output_path=, n_saved=, with_pbars=, "
        "log_every_iters=)",
        "`ProgressBar().attach(trainer, output_transform=...)`",
        "`Checkpoint.load_objects(to_load, checkpoint)`",
    ],
)
def test_the_guide_claims_what_the_tests_above_run(name):
    """Each row these tests execute is in the guide, as written."""
    assert re.sub(r"\s+", " ", name.strip("`")) in re.sub(r"\s+", " ", GUIDE)
