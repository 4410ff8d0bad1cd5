import io
import json
import logging
import re

import jax
import numpy as np
import pytest

from ember import Engine, Events
from ember.data import ArrayDataset
from ember.handlers import (
    EarlyStopping,
    Evaluate,
    ScalarLogger,
    global_step_from_engine,
    setup_common_training_handlers,
)
from ember.metrics import Average
from ember.training import create_evaluator
from ember.writers import CsvWriter, JsonlWriter, MultiWriter, TensorBoardWriter
from tests.handlers.trainers import DATA, evaluator, trainer


def test_evaluate_every_n_iterations_writes_metrics_under_a_label_at_the_trainer_step(tmp_path):
    t = trainer()
    ev = evaluator(t)
    Average(key="correct").attach(ev, "accuracy")
    evaluate = Evaluate(ev, DATA[:2], writer=JsonlWriter(tmp_path / "log.jsonl"), tag="val")
    evaluate.attach(t, Events.ITERATION_COMPLETED(every=3))
    t.run(DATA, max_epochs=2)
    assert [step for step, _ in evaluate.history] == [3, 6]
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [(r["step"], round(r["val/accuracy"], 6)) for r in rows] == [
        (step, round(m["accuracy"], 6)) for step, m in evaluate.history
    ]
    assert all(0.0 <= r["val/accuracy"] <= 1.0 for r in rows)


def test_early_stopping_on_a_real_evaluator_with_an_epoch_logger():
    """Validation accuracy drives early stopping; an evaluator logger uses the trainer's iteration."""
    t = trainer()
    ev = evaluator(t)
    Average(key="correct").attach(ev, "accuracy")
    out = io.StringIO()
    from ember.writers import ConsoleWriter

    step = global_step_from_engine(t, Events.ITERATION_COMPLETED)  # the trainer's iteration
    ScalarLogger(ConsoleWriter(out), tag="val", global_step_transform=step).attach(ev, Events.COMPLETED)
    scores = iter([0.5, 0.4, 0.4, 0.3, 0.9])  # the stop comes from the handler's counter, not the data
    stop = EarlyStopping(2, lambda e: next(scores), t)
    stop.attach(ev)
    Evaluate(ev, DATA[:1]).attach(t)
    assert t.run(DATA, max_epochs=10).epoch == 3
    assert [line.split(" | ")[0] for line in out.getvalue().splitlines()] == ["step 4", "step 8", "step 12"]
    assert stop.state_dict() == {"counter": 2, "best_score": 0.5}


def test_common_training_handlers_on_a_real_trainer(tmp_path):
    t = trainer()
    log = tmp_path / "log.jsonl"
    handlers = setup_common_training_handlers(
        t,
        writer=JsonlWriter(log),
        log_every_iters=2,
        with_pbars=False,
        output_path=tmp_path / "ckpt",
        save_every_iters=3,
        n_saved=2,
    )
    losses = []
    t.add_event_handler(Events.ITERATION_COMPLETED, lambda e: losses.append(float(e.state.output["loss"])))
    t.run(DATA, max_epochs=2)
    assert sorted(handlers) == ["checkpoint", "logger", "running_average", "terminate_on_nan"]
    expected, avg = [], 0.0
    for i, loss in enumerate(losses, 1):
        avg = loss if i == 1 else 0.98 * avg + 0.02 * loss
        if i % 2 == 0:
            expected.append((i, avg))
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4, 6, 8]
    np.testing.assert_allclose([r["train/loss"] for r in rows], [v for _, v in expected], rtol=1e-5)
    assert [c.step for c in handlers["checkpoint"].store.checkpoints()] == [6, 8]


def test_common_training_handlers_stop_on_nan_and_check_arguments():
    engine = Engine(lambda e, b: {"loss": np.float32(b)})
    setup_common_training_handlers(engine, with_pbars=False, running_average=None)
    assert engine.run([1.0, float("nan"), 1.0, 1.0, 1.0]).iteration == 3
    with pytest.raises(ValueError, match=re.escape("`log_every_iters` must be a positive int, got 0.")):
        setup_common_training_handlers(engine, log_every_iters=0)
    with pytest.raises(TypeError, match=re.escape("got ['progress'], which only apply to the checkpoint")):
        setup_common_training_handlers(Engine(lambda e, b: b), progress=False, running_average=None, stop_on_nan=False)
    with pytest.raises(TypeError, match=re.escape("`trainer` must be an ember Engine, got int.")):
        setup_common_training_handlers(3)  # type: ignore[arg-type]


def test_evaluate_arguments():
    with pytest.raises(TypeError, match=re.escape("`evaluator` must be an ember Engine, got list.")):
        Evaluate([], [])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=re.escape("`writer` must be an ember.writers.Writer or None, got str.")):
        Evaluate(Engine(lambda e, b: b), [], writer="log")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=re.escape("`precompile` must be True or False, got 'yes'.")):
        Evaluate(Engine(lambda e, b: b), [], precompile="yes")  # type: ignore[arg-type]


def test_evaluate_covers_every_example_as_numpy_over_the_whole_set_does():
    """At every epoch, accuracy and loss equal NumPy's over all 57 examples with that moment's parameters."""
    import optax

    from ember.metrics import Accuracy, Loss
    from ember.training import create_evaluator

    t = trainer()
    val = [*DATA[:3], {"x": DATA[3]["x"][:9], "y": DATA[3]["y"][:9]}]  # 16 + 16 + 16 + 9 examples
    ev = create_evaluator(t, lambda model, b: {"y_pred": model(b["x"]), "y": b["y"]})
    Accuracy().attach(ev, "accuracy")
    Loss(optax.softmax_cross_entropy_with_integer_labels).attach(ev, "loss")
    expected = []

    def by_numpy(engine):  # at the same event, before the evaluation: the parameters it evaluates
        p = engine.state.train_state.params
        x = np.concatenate([b["x"] for b in val])
        y = np.concatenate([b["y"] for b in val])
        logits = x @ np.asarray(p["w"]) + np.asarray(p["b"])
        shifted = logits - logits.max(1, keepdims=True)
        losses = np.log(np.exp(shifted).sum(1)) - shifted[np.arange(len(y)), y]
        expected.append({"accuracy": float(np.mean(logits.argmax(1) == y)), "loss": float(losses.mean())})

    t.add_event_handler(Events.EPOCH_COMPLETED, by_numpy)
    evaluate = Evaluate(ev, val)
    evaluate.attach(t, Events.EPOCH_COMPLETED)
    t.run(DATA, max_epochs=3)
    assert len(evaluate.history) == len(expected) == 3
    for (_, got), want in zip(evaluate.history, expected, strict=True):
        assert got["accuracy"] == pytest.approx(want["accuracy"], abs=1e-7)
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert len({round(m["loss"], 6) for _, m in evaluate.history}) == 3  # the parameters changed between them


class _Sampler:
    def __init__(self):
        self.epochs = []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)


def test_common_training_handlers_take_ignites_sampler_output_names_and_pbar_choice(tmp_path):
    """train_sampler.set_epoch(epoch - 1) each epoch; one running average per output name; an epochs bar alone."""
    import io

    sampler, out = _Sampler(), io.StringIO()
    engine = Engine(lambda e, b: {"loss": np.float32(b), "acc": np.float32(1 - b)})
    handlers = setup_common_training_handlers(
        engine, train_sampler=sampler, output_names=["loss", "acc"], with_pbar_on_iters=False, log_every_iters=1
    )
    handlers["progress"].stream, handlers["progress"].display = out, "bar"  # drawn as on a terminal
    state = engine.run([0.5, 0.25], max_epochs=2)
    assert sampler.epochs == [0, 1]
    assert sorted(state.metrics) == ["acc", "loss"]
    loss = 0.98 * (0.98 * (0.98 * 0.5 + 0.02 * 0.25) + 0.02 * 0.5) + 0.02 * 0.25
    assert float(state.metrics["loss"]) == pytest.approx(loss)
    assert float(state.metrics["acc"]) == pytest.approx(1 - loss)
    assert "Epochs" in out.getvalue()
    assert "Epoch [" not in out.getvalue()  # the iteration bar is off
    seq = Engine(lambda e, b: (np.float32(b), np.float32(2 * b)))
    setup_common_training_handlers(seq, output_names=["a", "b"], with_pbars=False, stop_on_nan=False)
    assert float(seq.run([1.0]).metrics["b"]) == 2.0
    with pytest.raises(TypeError, match=re.escape("`train_sampler` must have a set_epoch(epoch) method, got list.")):
        setup_common_training_handlers(engine, train_sampler=[])
    with pytest.raises(
        ValueError, match=re.escape("`to_save` was given, but neither `output_path` nor `save_handler`")
    ):
        setup_common_training_handlers(engine, to_save={"trainer": engine})
    with pytest.raises(TypeError, match=re.escape("`output_names` must be a list of names of the trainer's outputs")):
        setup_common_training_handlers(engine, output_names="loss")
    saved = []
    user = Engine(lambda e, b: {"loss": np.float32(b)})
    setup_common_training_handlers(
        user, save_handler=lambda c, f, m: saved.append(f), save_every_iters=2, with_pbars=False, n_saved=None
    )
    user.run([1.0] * 4)
    # every 2 iterations and at COMPLETED; a save handler of yours is called each time, as Ignite calls it (the
    # second save of step 4 holds the epoch's end, which the first, taken before EPOCH_COMPLETED, does not)
    assert saved == ["trainer_2.ckpt", "trainer_4.ckpt", "trainer_4.ckpt"]
    prefixed = Engine(lambda e, b: {"loss": np.float32(b)})
    found = setup_common_training_handlers(
        prefixed, output_path=tmp_path / "c", filename_prefix="training", with_pbars=False, save_every_iters=2
    )
    prefixed.run([1.0] * 4)
    assert [c.path.name for c in found["checkpoint"].store.checkpoints()] == [
        "training_step_00000002",
        "training_step_00000004",
    ]
    with pytest.raises(TypeError, match=re.escape("got ['filename_prefix'], which only apply to the checkpoint")):
        setup_common_training_handlers(prefixed, filename_prefix="training")


def compiled_by_thread(caplog, run):
    """``run()`` under JAX's compile log: the thread name of each XLA compilation it made, in order."""
    jax.config.update("jax_log_compiles", True)  # for every thread (the context manager's setting is the thread's)
    try:
        with caplog.at_level(logging.WARNING, logger="jax"):
            run()
    finally:
        jax.config.update("jax_log_compiles", False)
    done = [r for r in caplog.records if r.getMessage().startswith("Finished XLA compilation of jit(")]
    return [r.threadName.rsplit("_", 1)[0] for r in done]


@pytest.mark.parametrize("data", ["array_dataset", "list"])
def test_evaluate_compiles_the_evaluators_step_in_the_background_as_the_trainer_starts(
    caplog, fresh_compilations, data
):
    """The eval step compiles on a thread of its own while the trainer compiles; the first evaluation compiles nothing.

    The metrics are those of an evaluator that compiled for itself.
    """
    arrays = {"x": np.concatenate([b["x"] for b in DATA]), "y": np.concatenate([b["y"] for b in DATA])}
    val = ArrayDataset(arrays, batch_size=8) if data == "array_dataset" else DATA
    results = {}
    for precompile in (True, False):
        t = trainer()
        ev = evaluator(t)
        Average(output_transform=lambda o: o["correct"]).attach(ev, "accuracy")
        evaluate = Evaluate(ev, val, precompile=precompile)
        evaluate.attach(t, Events.EPOCH_COMPLETED)
        caplog.clear()
        threads = compiled_by_thread(caplog, lambda t=t: t.run(DATA, max_epochs=2))
        results[precompile] = (threads, [m["accuracy"] for _, m in evaluate.history])
    (ahead, with_it), (_, without) = results[True], results[False]
    assert sorted(ahead) == ["MainThread", "ember-precompile"]  # the train step, the eval step: each once
    assert with_it == without


def test_evaluate_compiles_nothing_ahead_for_data_it_cannot_peek(caplog, fresh_compilations):
    """An iterator (or a Grain loader) cannot be looked into without moving it: the first evaluation compiles."""
    t = trainer()
    ev = evaluator(t)
    Average(output_transform=lambda o: o["correct"]).attach(ev, "accuracy")

    class Batches:
        def __iter__(self):
            return iter(DATA)

    Evaluate(ev, Batches()).attach(t, Events.EPOCH_COMPLETED)
    assert compiled_by_thread(caplog, lambda: t.run(DATA, max_epochs=1)) == ["MainThread", "MainThread"]


def test_precompile_says_where_the_run_compiles_for_itself():
    """A trainer, a batch that would be padded over the devices, debug=True: the future's result is False."""
    t = trainer()
    assert t.precompile(DATA[0]).result() is False
    debug = create_evaluator(t, lambda model, batch: model(batch["x"]), debug=True)
    assert debug.precompile(DATA[0]).result() is False
    assert evaluator(t).precompile(DATA[0]).result() is True


def test_an_array_metric_goes_to_writers_that_show_arrays_the_others_say_so_once(tmp_path, caplog):
    """A ConfusionMatrix beside Accuracy, two evaluations, and the run goes on.

    JSONL records the matrix as a nested list, TensorBoard as a table; CSV leaves it out and says so once; accuracy
    reaches all three.
    """
    from ember.metrics import Accuracy, ConfusionMatrix
    from tests.writers.tb_reader import read_events, read_scalars

    trainer = Engine(lambda e, b: b)
    evaluator = Engine(lambda e, b: {"y_pred": np.eye(3, dtype=np.float32)[[0, 1, 2, 2]], "y": np.array([0, 1, 2, 1])})
    Accuracy().attach(evaluator, "accuracy")
    ConfusionMatrix(3).attach(evaluator, "cm")
    writer = MultiWriter(
        [JsonlWriter(tmp_path / "m.jsonl"), CsvWriter(tmp_path / "m.csv"), TensorBoardWriter(tmp_path)]
    )
    Evaluate(evaluator, [0], writer=writer, tag="val").attach(trainer)
    with caplog.at_level(logging.WARNING, logger="ember.writers"):
        trainer.run([0, 1], max_epochs=2)
    assert [r.getMessage() for r in caplog.records if r.name == "ember.writers"] == [
        "CsvWriter leaves out 'val/cm', an array of shape (3, 3): it shows numbers only (TensorBoardWriter shows "
        "arrays as tables, JsonlWriter records them)."
    ]
    cm = [[1, 0, 0], [0, 1, 1], [0, 0, 1]]
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in r.items() if k != "time"} for r in rows] == [
        {"step": 2, "val/accuracy": 0.75},
        {"step": 2, "array": {"val/cm": cm}},
        {"step": 4, "val/accuracy": 0.75},
        {"step": 4, "array": {"val/cm": cm}},
    ]
    assert (tmp_path / "m.csv").read_text().splitlines() == [
        "step,name,value",
        "2,val/accuracy,0.75",
        "4,val/accuracy,0.75",
    ]
    assert read_scalars(tmp_path) == {"val/accuracy": [(2, 0.75), (4, 0.75)]}
    tables = [
        (e.step, v.tensor.string_val[0].decode())
        for e in read_events(tmp_path)
        for v in e.summary.value
        if v.tag.startswith("val/cm")
    ]
    table = "| | 0 | 1 | 2 |\n|---|---|---|---|\n| **0** | 1 | 0 | 0 |\n| **1** | 0 | 1 | 1 |\n| **2** | 0 | 0 | 1 |"
    assert tables == [(2, table), (4, table)]
