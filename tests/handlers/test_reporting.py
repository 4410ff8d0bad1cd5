import io
import re
import threading

import numpy as np
import optax
import pytest

from ember import Engine, Events
from ember.handlers import GradientSpikeMonitor, LRMonitor, ParamStats, ProgressBar, ScalarLogger, count_parameters
from ember.metrics import Average, RunningAverage
from ember.writers import TensorBoardWriter, Writer
from tests.handlers.trainers import DATA, SCHEDULE, trainer
from tests.writers.tb_reader import read_scalars


class Remember(Writer):
    def __init__(self):
        self.rows = []

    def write_scalars(self, step, values):
        self.rows.append((step, {k: round(float(v), 6) for k, v in values.items()}))


def bar_frames(out):
    """Every frame tqdm drew, without cursor movements."""
    text = out.getvalue().replace("\x1b[A", "").replace("\n", "\r")
    return [f.strip() for f in text.split("\r") if f.strip()]


def test_progress_bar_totals_postfix_and_epochs():
    """Per-epoch bars with the right totals; the postfix lags one refresh, then shows the epoch's metrics."""
    out = io.StringIO()
    t = trainer()
    RunningAverage(output_transform=lambda o: o["loss"]).attach(t, "loss")
    bar = ProgressBar(
        2,
        stream=out,
        display="bar",
        persist=True,
        epoch_bar=True,
        mininterval=0,
        bar_format="{desc} {n}/{total}{postfix}",
    )
    bar.attach(t, metric_names=["loss"])
    t.run(DATA, max_epochs=2)
    frames = [f.split(", loss=")[0] + (", loss" if ", loss=" in f else "") for f in bar_frames(out)]
    assert frames == [
        "Epochs 0/2",
        "Epoch [1/2]:  0/4",
        "Epoch [1/2]:  2/4",  # the first refresh has nothing fetched yet
        "Epoch [1/2]:  4/4, loss",  # the value fetched at iteration 2
        "Epoch [1/2]:  4/4, loss",  # the epoch's end: this iteration's value
        "Epochs 1/2",
        "Epoch [2/2]:  0/4",
        "Epoch [2/2]:  2/4",
        "Epoch [2/2]:  4/4, loss",
        "Epoch [2/2]:  4/4, loss",
        "Epochs 2/2",
        "Epochs 2/2",
    ]
    assert ProgressBar._open == 0


def test_progress_bar_with_unknown_length_and_nested_evaluator():
    """A generator gets a bar without a total; an evaluator's bar is drawn one line below and not kept."""
    out = io.StringIO()
    engine = Engine(lambda e, b: {"loss": float(b)})
    inner = Engine(lambda e, b: b)
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda: inner.run([1, 2, 3]))
    ProgressBar(1, stream=out, display="bar", mininterval=0, bar_format="{desc} {n}/{total}{postfix}").attach(
        engine, output_keys=["loss"]
    )
    ProgressBar(1, stream=out, display="bar", mininterval=0, desc="Eval", bar_format="{desc} {n}/{total}").attach(inner)
    engine.run((x for x in range(3)), max_epochs=1)
    frames = bar_frames(out)
    assert frames == [  # one epoch: Ignite's "Iteration", or the desc given, without "[1/1]"
        "Iteration:  0/None",
        "Iteration:  1/None",
        "Iteration:  2/None, loss=0",
        "Iteration:  3/None, loss=1",
        *("Eval:  0/3", "Eval:  1/3", "Eval:  2/3", "Eval:  3/3"),
    ]
    assert out.getvalue().count("\x1b[A") == 5  # drawn on the line below the trainer's bar, then cleared


def test_progress_bar_arguments():
    with pytest.raises(ValueError, match=re.escape("`refresh_every` must be a positive int, got 0.")):
        ProgressBar(0)
    with pytest.raises(
        TypeError, match=re.escape("`metric_names` must be \"all\", None or a sequence of names, got 'loss'.")
    ):
        ProgressBar().attach(Engine(lambda e, b: b), metric_names="loss")


def test_scalar_logger_writes_metrics_and_outputs_to_tensorboard(tmp_path):
    """Training loss every 2 iterations and the epoch's metric, read back from the event file."""
    t = trainer(extras=("grad_norm",))
    Average(key="loss").attach(t, "avg_loss")
    writer = TensorBoardWriter(tmp_path)
    ScalarLogger(writer, tag="train", metric_names=None, output_keys=["loss", "grad_norm"]).attach(
        t, Events.ITERATION_COMPLETED(every=2)
    )
    ScalarLogger(writer, tag="epoch").attach(t, Events.EPOCH_COMPLETED)
    losses = []
    t.add_event_handler(Events.ITERATION_COMPLETED, lambda e: losses.append(round(float(e.state.output["loss"]), 6)))
    t.run(DATA, max_epochs=2)
    scalars = read_scalars(tmp_path)
    assert sorted(scalars) == ["epoch/avg_loss", "train/grad_norm", "train/loss"]
    assert scalars["train/loss"] == [(i, losses[i - 1]) for i in (2, 4, 6, 8)]
    assert [s for s, _ in scalars["epoch/avg_loss"]] == [4, 8]
    assert scalars["epoch/avg_loss"][0][1] == pytest.approx(np.mean(losses[:4]), abs=1e-6)


def test_output_transform_names_the_per_step_loss_apart_from_an_evaluators(tmp_path):
    """Ignite's OutputHandler pattern: the step's loss as "training/batchloss", the epoch's as "training/loss"."""
    t = trainer()
    Average(key="loss").attach(t, "loss")
    writer = TensorBoardWriter(tmp_path)
    ScalarLogger(writer, tag="training", metric_names=None, output_transform=lambda o: {"batchloss": o["loss"]}).attach(
        t, Events.ITERATION_COMPLETED(every=2)
    )
    ScalarLogger(writer, tag="training").attach(t, Events.EPOCH_COMPLETED)
    one = Remember()
    ScalarLogger(one, metric_names=None, output_transform=lambda o: o["loss"]).attach(
        t, Events.ITERATION_COMPLETED(once=3)
    )
    losses = []
    t.add_event_handler(Events.ITERATION_COMPLETED, lambda e: losses.append(round(float(e.state.output["loss"]), 6)))
    t.run(DATA, max_epochs=2)
    scalars = read_scalars(tmp_path)
    assert sorted(scalars) == ["training/batchloss", "training/loss"]
    assert scalars["training/batchloss"] == [(i, losses[i - 1]) for i in (2, 4, 6, 8)]
    assert [s for s, _ in scalars["training/loss"]] == [4, 8]
    assert one.rows == [(3, {"output": losses[2]})]  # one value: named "output", as Ignite names it
    with pytest.raises(
        TypeError, match=re.escape("`output_transform` must be callable as output_transform(output), got 3")
    ):
        ScalarLogger(one, output_transform=3)  # type: ignore[arg-type]


def test_progress_bar_shows_what_output_transform_names():
    out = io.StringIO()
    t = trainer()
    bar = ProgressBar(2, stream=out, display="bar", mininterval=0, bar_format="{desc} {n}/{total}{postfix}")
    bar.attach(t, output_transform=lambda o: {"batchloss": o["loss"]})
    t.run(DATA)
    assert re.fullmatch(r"Iteration:  4/4, batchloss=[\d.]+", bar_frames(out)[-1])


def test_loggers_sharing_a_writer_share_one_thread_in_call_order():
    """Two loggers on one plain writer get one AsyncWriter: every record on one thread, in call order.

    Two threads calling one writer (tensorboardX's is not thread-safe) lost the last epoch's record on a
    GPU machine.
    """

    class Recording(Writer):
        def __init__(self) -> None:
            self.records: list[tuple[str, int, list[str]]] = []

        def write_scalars(self, step, values):
            self.records.append((threading.current_thread().name, step, sorted(values)))

    writer = Recording()
    t = Engine(lambda e, b: {"loss": float(b)})
    first = ScalarLogger(writer, tag="it", metric_names=None, output_keys=["loss"])
    first.attach(t, Events.ITERATION_COMPLETED(every=2))
    second = ScalarLogger(writer, tag="epoch", metric_names=None, output_keys=["loss"])
    second.attach(t, Events.EPOCH_COMPLETED)
    t.run([1.0, 2.0, 3.0, 4.0], max_epochs=2)
    assert first.writer is second.writer
    assert [(step, names) for _, step, names in writer.records] == [
        (2, ["it/loss"]),
        (4, ["it/loss"]),
        (4, ["epoch/loss"]),
        (6, ["it/loss"]),
        (8, ["it/loss"]),
        (8, ["epoch/loss"]),
    ]
    assert len({thread for thread, _, _ in writer.records}) == 1
    first.writer.close()
    third = ScalarLogger(writer, metric_names=None, output_keys=["loss"])
    third.attach(t, Events.EPOCH_COMPLETED)
    assert third.writer is not first.writer  # a closed one is not reused


def test_scalar_logger_names_missing_keys():
    engine = Engine(lambda e, b: {"loss": b})
    ScalarLogger(Remember(), output_keys=["grad_norm"]).attach(engine, Events.ITERATION_COMPLETED)
    with pytest.raises(
        KeyError, match=r"Output keys \['grad_norm'\] are not in engine.state.output \(it holds \['loss'\]\)"
    ):
        engine.run([1.0])


def test_lr_monitor_from_the_schedule_and_from_the_step_agree():
    """The host-evaluated schedule and the step's injected hyperparameter give the same numbers."""
    by_schedule, by_state = Remember(), Remember()
    a = trainer()
    LRMonitor(by_schedule, schedule=SCHEDULE).attach(a, Events.ITERATION_COMPLETED(every=3))
    a.run(DATA, max_epochs=2)
    b = trainer(extras=("lr",), optimizer=optax.inject_hyperparams(optax.sgd)(learning_rate=SCHEDULE))
    monitor = LRMonitor(by_state)
    monitor.attach(b, Events.ITERATION_COMPLETED(every=3))
    b.run(DATA, max_epochs=2)
    b.state.output = None
    monitor.writer.flush()
    expected = [(3, {"lr": 0.0875}), (6, {"lr": 0.06875})]
    assert by_schedule.rows == expected
    assert by_state.rows == expected


def test_lr_monitor_without_schedule_needs_the_lr_extra():
    t = trainer()
    LRMonitor(Remember()).attach(t, Events.ITERATION_COMPLETED)
    with pytest.raises(ValueError, match=r"create_trainer\(..., extras=\('lr',\)\)"):
        t.run(DATA)


def test_param_stats_counts_before_training():
    rows = Remember()
    t = trainer()
    stats = ParamStats(rows)
    stats.attach(t)
    t.run(DATA[:1])
    stats.writer.flush()
    assert (stats.count, stats.bytes) == (15, 60)
    assert rows.rows == [(0, {"params/count": 15.0, "params/bytes": 60.0})]
    assert count_parameters({"a": np.zeros((2, 2), np.int8)}) == (4, 4)


def test_gradient_spike_monitor_on_a_real_trainer_and_its_state():
    """A batch scaled by 1000 makes the gradient spike; the monitor flags exactly that iteration."""
    data = [dict(b) for b in DATA * 3]
    data[9] = {"x": data[9]["x"] * 1000.0, "y": data[9]["y"]}
    t = trainer(extras=("grad_norm",))
    seen = []
    monitor = GradientSpikeMonitor(factor=10.0, warmup=4, on_spike=lambda e, i, n: seen.append((e.state.iteration, i)))
    monitor.attach(t)
    t.run(data)
    assert [i for i, _ in monitor.spikes] == [10]
    assert seen == [(11, 10)]
    restored = GradientSpikeMonitor(factor=10.0, warmup=4)
    restored.load_state_dict(monitor.state_dict())
    assert restored.state_dict() == monitor.state_dict()
    assert monitor.state_dict()["seen"] == 12


def test_gradient_spike_monitor_needs_the_norm():
    engine = Engine(lambda e, b: {"loss": b})
    GradientSpikeMonitor().attach(engine)
    with pytest.raises(KeyError, match=r"GradientSpikeMonitor reads output\['grad_norm'\]"):
        engine.run([1.0])
    with pytest.raises(ValueError, match=re.escape("`factor` must be a number above 1, got 1.")):
        GradientSpikeMonitor(1)


def test_per_layer_gradient_and_weight_norms_and_histograms(tmp_path):
    """Ignite's Grads/Weights handlers: per-layer norms equal NumPy's on the same step; histograms per layer."""
    from ember.handlers import GradsHistHandler, GradsScalarHandler, WeightsHistHandler, WeightsScalarHandler
    from tests.writers.tb_reader import tags

    t = trainer(extras=("grad_norms", "param_norms", "grads"))
    writer = TensorBoardWriter(tmp_path)
    every = Events.ITERATION_COMPLETED(every=2)
    for handler in (GradsScalarHandler(writer), WeightsScalarHandler(writer)):
        handler.attach(t, every)
    GradsHistHandler(writer).attach(t, Events.COMPLETED)
    weights = WeightsHistHandler(writer)
    weights.attach(t, Events.COMPLETED)
    grads = []
    t.add_event_handler(every, lambda e: grads.append({k: np.asarray(v) for k, v in e.state.output["grads"].items()}))
    t.run(DATA)
    weights.writer.flush()  # attached after the writer's flush at COMPLETED: its writes come later
    scalars = read_scalars(tmp_path)
    assert sorted(k for k in scalars if k.startswith(("grads/", "weights/"))) == [
        "grads/norm/b",
        "grads/norm/w",
        "weights/norm/b",
        "weights/norm/w",
    ]
    assert [s for s, _ in scalars["grads/norm/w"]] == [2, 4]
    for i, (_, norm) in enumerate(scalars["grads/norm/w"]):
        assert norm == pytest.approx(float(np.linalg.norm(grads[i]["w"])), rel=1e-5)
    assert {"grads/w", "grads/b", "weights/w", "weights/b"} <= tags(tmp_path)
    plain = trainer()
    plain.run(DATA[:1])
    with pytest.raises(KeyError, match=re.escape("create_trainer(..., extras=('grad_norms',))")):
        GradsScalarHandler(Remember())(plain)


def test_lr_monitor_hands_the_rate_to_the_writer_unread_and_last_reads_it():
    """The scheduled rate goes to the writer's thread as a value on the host's CPU device; ``last`` is its float."""
    rows = []

    class Raw(Writer):
        def write_scalars(self, step, values):
            rows.append((step, {k: type(v).__name__ for k, v in values.items()}, float(values["lr"])))

    t = trainer()
    monitor = LRMonitor(Raw(), schedule=SCHEDULE)
    monitor.attach(t, Events.ITERATION_COMPLETED(every=3))
    assert monitor.last is None
    t.run(DATA, max_epochs=2)
    monitor.writer.flush()
    assert [(step, kinds) for step, kinds, _ in rows] == [(3, {"lr": "float"}), (6, {"lr": "float"})]
    assert [round(lr, 6) for *_, lr in rows] == [0.0875, 0.06875]
    assert round(monitor.last, 6) == 0.06875


def test_lr_monitor_takes_a_schedule_with_python_branches():
    """A schedule of plain Python (a branch on the step, a float returned) is written as it is."""
    rows = Remember()
    t = trainer()
    monitor = LRMonitor(rows, schedule=lambda step: 0.1 if step < 4 else 0.01)
    monitor.attach(t, Events.ITERATION_COMPLETED(every=3))
    t.run(DATA, max_epochs=2)
    monitor.writer.flush()
    assert rows.rows == [(3, {"lr": 0.1}), (6, {"lr": 0.01})]
    assert monitor.last == 0.01
