"""The Ignite migration guide's name table, executed: each ember name takes the Ignite arguments its row claims."""

import inspect
from pathlib import Path

import jax
import pytest

from ember import Engine, Events, State

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


def _table_rows() -> list[str]:
    """The Ignite column of the guide's name table, one cell per row."""
    table = GUIDE.split("| PyTorch Ignite | ember |", 1)[1].split("\n\n", 1)[0]
    return [line.split(" | ", 1)[0].removeprefix("| ") for line in table.splitlines() if line.startswith("| ")]


def accepts(fn, *args, **kwargs) -> None:
    """``fn`` takes these arguments by these names (bound, not called)."""
    inspect.signature(fn).bind(*args, **kwargs)


def _filters() -> None:
    engine, seen = Engine(lambda e, b: b), []
    for name, event in [
        ("every", Events.ITERATION_COMPLETED(every=2)),
        ("once", Events.ITERATION_COMPLETED(once=3)),
        ("once list", Events.ITERATION_COMPLETED(once=[1, 5])),
        ("event_filter", Events.ITERATION_COMPLETED(event_filter=lambda e, i: i % 3 == 0)),
        ("before", Events.ITERATION_COMPLETED(before=3)),
        ("after", Events.ITERATION_COMPLETED(after=4)),
    ]:
        engine.add_event_handler(event, lambda e, name=name: seen.append((name, e.state.iteration)))
    engine.run(range(6))
    assert sorted(seen) == [
        ("after", 5),
        ("after", 6),
        ("before", 1),
        ("before", 2),
        ("event_filter", 3),
        ("event_filter", 6),
        ("every", 2),
        ("every", 4),
        ("every", 6),
        ("once", 3),
        ("once list", 1),
        ("once list", 5),
    ]
    accepts(Events.ITERATION_COMPLETED, every_secs=1.0)


def _handler_registry() -> None:
    engine, seen = Engine(lambda e, b: b), []

    @engine.on(Events.STARTED)
    def started(e):
        seen.append("started")

    engine.add_event_handler(Events.COMPLETED, started)
    assert engine.has_event_handler(started, Events.COMPLETED)
    engine.remove_event_handler(started, Events.COMPLETED)
    assert not engine.has_event_handler(started, Events.COMPLETED)
    engine.run([1])
    assert seen == ["started"]


def _state() -> None:
    engine = Engine(lambda e, b: b * 10)
    state = engine.run([1, 2], max_epochs=2)
    assert (state.iteration, state.epoch, state.output, state.metrics, state.batch) == (4, 2, 20, {}, 2)


def _termination() -> None:
    engine = Engine(lambda e, b: b)
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=2), lambda e: e.interrupt())
    assert engine.run(range(4)).iteration == 2
    assert engine.run().iteration == 4  # interrupt() pauses; run() goes on, as in Ignite
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=5), lambda e: e.terminate_epoch())
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=6), lambda e: e.terminate())
    assert engine.run(range(4), max_epochs=3).iteration == 6


def _engine_state_dict() -> None:
    engine = Engine(lambda e, b: b)
    engine.run(range(3), max_epochs=2)
    assert engine.state_dict() == {"epoch_length": 3, "iteration": 6, "max_epochs": 2}  # Ignite's keys
    again = Engine(lambda e, b: b)
    again.load_state_dict({"epoch_length": 3, "iteration": 4, "max_epochs": 2})
    assert again.run(range(3)).iteration == 6


def _metric_names() -> None:
    from ember import metrics

    names = ["Accuracy", "Precision", "Recall", "Fbeta", "Loss", "ConfusionMatrix", "IoU", "mIoU"]
    names += ["RunningAverage", "MetricsLambda"]
    assert [name for name in names if not hasattr(metrics, name)] == []
    f1 = metrics.Precision() * metrics.Recall() * 2 / (metrics.Precision() + metrics.Recall())
    assert isinstance(f1, metrics.MetricsLambda)


def _usages() -> None:
    from ember.metrics import Average, MetricUsage

    for usage in ("epoch_wise", "batch_wise", "running_epoch_wise", "running_batch_wise"):
        Average().attach(Engine(lambda e, b: b), "value", usage=usage)
    Average().attach(Engine(lambda e, b: b), "value", usage="single_epoch_running_batch_wise")
    Average().attach(Engine(lambda e, b: b), "value", usage=MetricUsage.filtered(Events.ITERATION_COMPLETED(every=2)))


def _engine_names() -> None:
    import logging

    engine = Engine(lambda e, b: b)
    assert engine.has_registered_events(Events.STARTED)
    assert isinstance(engine.logger, logging.Logger)
    assert Engine.interrupt_resume_enabled is True


def _usage_classes() -> None:
    from ember import metrics

    for name in ("EpochWise", "BatchWise", "RunningEpochWise", "RunningBatchWise", "SingleEpochRunningBatchWise"):
        usage = getattr(metrics, name)()
        metrics.Average().attach(Engine(lambda e, b: b), "value", usage=usage)
    metrics.Average().attach(Engine(lambda e, b: b), "value", usage=metrics.BatchFiltered(every=2))


def _checkpoint_names() -> None:
    from ember.handlers import Checkpoint

    assert Checkpoint.setup_filename_pattern(False, False, False, True) == "{name}_{global_step}.{ext}"
    engine = Engine(lambda e, b: b)
    engine.state.metrics["acc"] = 0.5
    assert Checkpoint.get_default_score_fn("acc", -1.0)(engine) == -0.5
    saver = Checkpoint({"e": engine}, lambda c, f, m: None)
    saver(engine)
    assert (saver.last_checkpoint, saver.state_dict()["_saved"]) == ("e_0.ckpt", [(0, "e_0.ckpt")])
    saver.reset()
    assert saver.last_checkpoint is None
    assert callable(saver.save_handler)


def _tested_by(path: str, test: str):
    """A row whose behaviour has its own test elsewhere: the test must be there."""

    def check() -> None:
        assert f"def {test}(" in (Path(__file__).parent / path).read_text()

    return check


def _rows_checks() -> dict[str, object]:
    from ember import handlers, metrics, training, writers

    return {
        "`ignite.engine.Engine(process_function)`": lambda: Engine(lambda e, b: b * 2).run([1]).output == 2,
        "`Events.ITERATION_COMPLETED(every=100)`, `once=`, `event_filter=`, `before=`, `after=`": _filters,
        "`@trainer.on(...)`, `add_event_handler`, `remove_event_handler`, `has_event_handler`": _handler_registry,
        "`engine.state.iteration`, `.epoch`, `.output`, `.metrics`, `.batch`": _state,
        "`engine.terminate()`, `terminate_epoch()`, `interrupt()`": _termination,
        "`State(**kwargs)`": lambda: State(iteration=3, epoch=1).iteration == 3,
        "`engine.should_terminate`, `engine.should_terminate_single_epoch`": _tested_by(
            "engine/test_ignite_fidelity.py", "test_should_terminate_single_epoch_as_ignite_sets_it"
        ),
        "`engine.has_registered_events(event)`, `engine.logger`, `Engine.interrupt_resume_enabled`": _engine_names,
        "`Events.default_event_filter`, `RemovableEventHandle.engine`": _tested_by(
            "engine/test_ignite_fidelity.py", "test_default_event_filter_is_ignites_deprecated_always_true_filter"
        ),
        "`engine.run(data, max_iters=...)`": _tested_by(
            "engine/test_ignite_fidelity.py",
            "test_switching_a_finished_run_between_max_epochs_and_max_iters_needs_a_reset",
        ),
        "data whose `len()` raises `TypeError` (a `DataLoader` over an `IterableDataset`)": _tested_by(
            "engine/test_ignite_fidelity.py", "test_data_whose_len_raises_type_error_runs_as_unknown_length"
        ),
        "`engine.state_dict()` / `load_state_dict()`": _engine_state_dict,
        "`create_supervised_trainer(model, optimizer, loss_fn)`": lambda: accepts(
            training.create_supervised_trainer, model=None, optimizer=None, loss_fn=None
        ),
        "`create_supervised_evaluator(model, metrics=...)`": lambda: accepts(
            training.create_supervised_evaluator, "trainer", metrics={}
        ),
        "general trainer with your own `update(engine, batch)`": lambda: accepts(
            training.create_trainer, "train_state", "loss_fn"
        ),
        "`Accuracy`, `Precision`, `Recall`, `Fbeta`, `Loss`, `ConfusionMatrix`, `IoU`, `mIoU`, `RunningAverage`, "
        "`MetricsLambda`, metric arithmetic": _metric_names,
        "`metric.attach(engine, name, usage=...)`": _usages,
        "`EpochWise()`, `BatchWise()`, `RunningEpochWise()`, `RunningBatchWise()`, `SingleEpochRunningBatchWise()`, "
        "`BatchFiltered(every=...)`": _usage_classes,
        "`RunningAverage(src, alpha, output_transform, epoch_bound)`": lambda: accepts(
            metrics.RunningAverage, src=None, alpha=0.9, output_transform=None, epoch_bound=True
        ),
        "`Checkpoint(to_save, save_handler, filename_prefix, score_function, score_name, n_saved, "
        "global_step_transform, filename_pattern, include_self, greater_or_equal)`": lambda: accepts(
            handlers.Checkpoint,
            to_save={},
            save_handler="dir",
            filename_prefix="best",
            score_function=None,
            score_name="acc",
            n_saved=2,
            global_step_transform=None,
            filename_pattern="{name}_{global_step}.{ext}",
            include_self=True,
            greater_or_equal=True,
        ),
        "`BaseSaveHandler` (`__call__(checkpoint, filename, metadata)`, `remove(filename)`), or a function as "
        "`save_handler`": _tested_by(
            "handlers/test_save_handlers.py", "test_a_base_save_handler_gets_ignites_calls_names_metadata_and_dict"
        ),
        "`Checkpoint.setup_filename_pattern()`, `get_default_score_fn(name)`, `reset()`, `save_handler`, "
        "`last_checkpoint`, `state_dict()`": _checkpoint_names,
        "`DiskSaver(dirname, require_empty=...)`, `ModelCheckpoint(dirname, filename_prefix, n_saved=...)`, "
        "`global_step_from_engine(trainer)`": lambda: (
            accepts(handlers.DiskSaver, dirname="d", require_empty=False),
            accepts(handlers.ModelCheckpoint, dirname="d", filename_prefix="mnist", n_saved=2),
            accepts(handlers.global_step_from_engine, "trainer"),
        ),
        "`Checkpoint.load_objects(to_load, checkpoint)`": lambda: accepts(
            handlers.Checkpoint.load_objects, to_load={}, checkpoint="dir"
        ),
        "`Checkpoint.load_objects(to_load, checkpoint, strict=False)` (transfer learning)": lambda: (
            accepts(handlers.Checkpoint.load_objects, to_load={}, checkpoint="dir", strict=False),
            _tested_by(
                "handlers/test_checkpoint_ignite.py",
                "test_strict_false_loads_the_shared_arrays_keeps_the_rest_and_warns_of_both",
            )(),
        ),
        "`Checkpoint.SAVED_CHECKPOINT`, `CheckpointEvents`, a `Checkpoint` added on "
        "`Events.EXCEPTION_RAISED`": lambda: (
            (handlers.Checkpoint.SAVED_CHECKPOINT is handlers.CheckpointEvents.SAVED_CHECKPOINT)
            and (
                _tested_by(
                    "handlers/test_checkpoint_ignite.py",
                    "test_saved_checkpoint_fires_after_each_checkpoint_written_and_leaves_the_event_name",
                )(),
                _tested_by(
                    "handlers/test_checkpoint_ignite.py",
                    "test_a_checkpoint_on_exception_raised_saves_the_failed_runs_state",
                )(),
            )
        ),
        "`ProgressBar(persist=, bar_format=, file=, **tqdm_kwargs)`, `attach(engine, metric_names, output_transform, "
        "event_name, closing_event_name, state_attributes)`, `log_message(msg)`": _tested_by(
            "handlers/test_progress_ignite.py", "test_ignites_documented_lines_draw_ignites_bar"
        ),
        "`Fbeta(beta, average, precision=, recall=)`": _tested_by(
            "metrics/test_ignite_round_two.py", "test_fbeta_of_a_precision_and_a_recall_is_ignites_composition"
        ),
        "`BasicTimeProfiler()`, `attach(engine)`, `get_results()`, `print_results(results)`, `write_results(path)`": (
            _tested_by("handlers/test_basic_profiler.py", "test_results_are_ignites_with_each_time_where_it_was_spent")
        ),
        "`EarlyStopping(patience, score_function, trainer, threshold, cumulative, threshold_mode, mode)`": lambda: (
            accepts(
                handlers.EarlyStopping,
                patience=3,
                score_function=None,
                trainer=None,
                threshold=0.0,
                cumulative=False,
                threshold_mode="abs",
                mode="max",
            )
        ),
        "`setup_common_training_handlers(..., train_sampler=, output_names=, with_pbar_on_iters=, save_handler=, "
        "**kwargs)`": lambda: accepts(
            handlers.setup_common_training_handlers,
            trainer=None,
            train_sampler=None,
            output_names=["loss"],
            with_pbar_on_iters=False,
            save_handler=None,
            filename_prefix="training",
        ),
        "`EarlyStopping.attach(engine, event, reset_engine, reset_event)`, `reset()`": lambda: (
            accepts(handlers.EarlyStopping.attach, "self", "engine", event=None, reset_engine=None, reset_event=None),
            accepts(handlers.EarlyStopping.reset, "self"),
        ),
        "`EpochOutputStore(output_transform)`, `attach(engine, name)`, `data`": lambda: (
            accepts(handlers.EpochOutputStore, output_transform=None),
            accepts(handlers.EpochOutputStore.attach, "self", "engine", name="output"),
            handlers.EpochOutputStore().data == [],
        ),
        "`setup_common_training_handlers(trainer, to_save=, save_every_iters=, output_path=, n_saved=, with_pbars=, "
        "log_every_iters=)`": lambda: accepts(
            handlers.setup_common_training_handlers,
            trainer=None,
            to_save={},
            save_every_iters=10,
            output_path="d",
            n_saved=2,
            with_pbars=False,
            log_every_iters=10,
        ),
        "`TerminateOnNan`, `Timer`, `TimeLimit`": lambda: (
            accepts(handlers.TerminateOnNan, output_transform=None),
            accepts(handlers.Timer, average=True),
            accepts(handlers.TimeLimit, limit_sec=10),
        ),
        "`ProgressBar` (contrib)": lambda: accepts(handlers.ProgressBar, persist=True, bar_format="{l_bar}"),
        "`common.setup_common_training_handlers`": lambda: accepts(handlers.setup_common_training_handlers, "trainer"),
        '`TensorboardLogger`, `OutputHandler(tag, output_transform=lambda loss: {"batchloss": loss})`, '
        "`OptimizerParamsHandler`": lambda: (
            accepts(handlers.ScalarLogger, "writer", tag="training", output_transform=None),
            accepts(writers.TensorBoardWriter, "logdir"),
            accepts(handlers.LRMonitor, "writer", tag="lr"),
        ),
        "`ProgressBar().attach(trainer, output_transform=...)`": lambda: accepts(
            handlers.ProgressBar.attach, "self", "trainer", output_transform=None
        ),
        "`GradsScalarHandler`, `WeightsScalarHandler`, `GradsHistHandler`, `WeightsHistHandler`": lambda: [
            accepts(getattr(handlers, name), "writer", tag="grads")
            for name in ("GradsScalarHandler", "WeightsScalarHandler", "GradsHistHandler", "WeightsHistHandler")
        ],
        "your own `Metric` subclass: `reset` / `update` / `compute`, `@reinit__is_reduced`, "
        '`@sync_all_reduce("_num_examples", "_num_correct:SUM")`, '
        "`super().__init__(output_transform=..., device=...)`": (
            _tested_by(
                "metrics/test_ignite_style.py", "test_ignites_documented_custom_metric_attaches_and_computes_each_epoch"
            )
        ),
        "`TopKCategoricalAccuracy(k=5)`, `ROC_AUC()`, `EpochMetric(compute_fn, output_transform, check_compute_fn)`, "
        "`Frequency(output_transform).attach(trainer, name, event_name=...)`": lambda: (
            metrics.TopKCategoricalAccuracy().k == 5
            and metrics.ROC_AUC is metrics.RocAuc
            and accepts(metrics.EpochMetric, compute_fn=len, output_transform=None, check_compute_fn=False) is None
            and accepts(metrics.Frequency.attach, "self", "trainer", "wps", event_name=None) is None
        ),
        "`ignite.exceptions.NotComputableError` (a metric computed before any update)": lambda: (
            issubclass(metrics.NotComputableError, RuntimeError) and _raises_not_computable()
        ),
        "metrics' `output_transform` returning `(y_pred, y)` or `[y_pred, y]`": _tested_by(
            "test_ignite_names.py", "test_metrics_and_trainers_take_ignites_arguments"
        ),
        "one evaluator run on loaders of different batch sizes": _tested_by(
            "training/test_trainer.py", "test_one_evaluator_runs_on_data_of_different_batch_sizes"
        ),
        "`idist` (distributed)": lambda: (accepts(jax.distributed.initialize), accepts(training.DataParallel)),
        "`ReduceLROnPlateauScheduler(optimizer, metric_name, trainer, mode=, factor=, patience=, cooldown=)`": lambda: (
            accepts(training.scale_by_plateau, "tx"),
            accepts(
                training.ReduceLROnPlateau, "trainer", "metric_name", mode="max", factor=0.5, patience=3, cooldown=1
            ),
        ),
        "`FastaiLRFinder().attach(trainer, to_save)`, `lr_finder.lr_suggestion()`, `plot()`": lambda: (
            accepts(training.lr_find, "trainer", "data", start_lr=1e-6, end_lr=1.0, num_iter=50),
            accepts(training.LRFinderResult.plot, "self", "lr.png"),
        ),
        "`optuna_integration.PyTorchIgnitePruningHandler(trial, metric, trainer)`": lambda: accepts(
            handlers.OptunaPruning, trial="trial", metric="loss", trainer="trainer"
        ),
        "`HandlersTimeProfiler()`, `attach(engine)`, `get_results()` / `print_results()`": lambda: (
            accepts(handlers.HandlersTimeProfiler),
            accepts(handlers.HandlersTimeProfiler.attach, "self", "engine"),
            accepts(handlers.HandlersTimeProfiler.print_results, "self"),
        ),
        "`EMAHandler(model, momentum, momentum_warmup, warmup_iters)`": lambda: (
            accepts(training.ema, "tx", momentum=0.001, momentum_warmup=0.1, warmup_iters=10, every=1),
            accepts(training.create_evaluator, "trainer", "eval_fn", use_ema=True),
        ),
    }


@pytest.mark.parametrize("row", _table_rows())
def test_every_row_of_the_guides_name_table_holds(row):
    """Each row's ember names exist and take the Ignite arguments the row claims; a new row needs its check here."""
    checks = _rows_checks()
    assert row in checks, f"the guide's row {row!r} has no check in tests/test_ignite_names.py"
    assert checks[row]() is not False


def test_no_check_is_left_for_a_row_the_guide_dropped():
    assert sorted(set(_rows_checks()) - set(_table_rows())) == []


EVENTS_PAGE = (Path(__file__).resolve().parents[1] / "docs" / "concepts" / "events.md").read_text()
NUMBERS = {
    "Ten": 10,
    "Eleven": 11,
    "Twelve": 12,
    "Thirteen": 13,
    "Fourteen": 14,
    "Fifteen": 15,
    "Sixteen": 16,
    "Seventeen": 17,
    "Eighteen": 18,
}


def test_the_guide_counts_the_differences_the_events_page_numbers():
    """The guide says how many behaviours differ; the events page numbers exactly that many, 1 to N."""
    said = GUIDE.split("## Where ember deliberately differs", 1)[1].split()[0]
    listed = EVENTS_PAGE.split("<!-- differences", 1)[1].split("\nAdditions", 1)[0]
    numbers = [int(line.split(".", 1)[0]) for line in listed.splitlines() if line[:1].isdigit()]
    assert numbers == list(range(1, len(numbers) + 1))
    assert NUMBERS[said] == len(numbers)


def _raises_not_computable():
    from ember import metrics

    with pytest.raises(metrics.NotComputableError, match="was computed before any update"):
        metrics.Accuracy().compute()
    return True
