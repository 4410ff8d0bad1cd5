import io
import json
import re
import threading

import jax.numpy as jnp
import numpy as np
import pytest

import ember.writers._async as async_module
from ember import Engine, Events
from ember.handlers import attach_writer
from ember.writers import (
    AsyncWriter,
    ConsoleWriter,
    CsvWriter,
    JsonlWriter,
    MultiWriter,
    TensorBoardWriter,
    Writer,
    create_run_writer,
)
from tests.writers.tb_reader import read_scalars, tags


class Remember(Writer):
    def __init__(self):
        self.calls = []
        self.thread_names = set()

    def write_scalars(self, step, values):
        self.thread_names.add(threading.current_thread().name)
        self.calls.append(("scalars", step, dict(values)))

    def write_text(self, step, name, text):
        self.calls.append(("text", step, name, text))


class Broken(Writer):
    def write_scalars(self, step, values):
        if step == 2:
            raise OSError("disk gone")


def test_async_writer_keeps_order_converts_device_values_on_its_thread():
    inner = Remember()
    w = AsyncWriter(inner)
    w.write_scalars(1, {"loss": jnp.float32(0.5), "acc": np.float64(0.25), "n": 3})
    w.write_text(1, "note", "hi")
    w.write_scalars(2, {"loss": jnp.float32(0.125)})
    w.flush()
    assert inner.calls == [
        ("scalars", 1, {"loss": 0.5, "acc": 0.25, "n": 3.0}),
        ("text", 1, "note", "hi"),
        ("scalars", 2, {"loss": 0.125}),
    ]
    assert all(type(v) is float for v in inner.calls[0][2].values())
    assert inner.thread_names == {"ember-writer"}
    w.close()
    with pytest.raises(RuntimeError, match=re.escape("This AsyncWriter is closed.")):
        w.write_scalars(3, {"loss": 1.0})


def test_an_error_on_the_writer_thread_fails_the_run_at_the_next_event():
    """The thread's exception is raised in the training thread, once; the run ends with it; nothing hangs."""
    w = AsyncWriter(Broken())
    engine = Engine(lambda e, b: b)
    attach_writer(w, engine)
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: w.write_scalars(e.state.iteration, {"x": 1.0}))
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: w.flush())  # make the failure visible at once
    seen = []
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(e.state.iteration))
    with pytest.raises(OSError, match="disk gone") as info:
        engine.run(range(10))
    assert seen == [1]
    assert "(raised on ember's writer thread)" in info.value.__notes__
    w.close()  # reported already: closing does not raise again, and returns


def test_only_the_primary_process_writes(monkeypatch, tmp_path):
    monkeypatch.setattr(async_module, "is_primary_process", lambda: False)
    w = create_run_writer(tmp_path / "run", ["tensorboard", "jsonl", "csv"])
    w.write_scalars(1, {"loss": 1.0})
    w.close()
    assert not (tmp_path / "run").exists()


def test_files_tensorboard_and_console_through_one_run_writer(tmp_path):
    """Two runs into the same folder (a resume) append to the logs and both TensorBoard files stay readable."""
    out = io.StringIO()
    for start in (1, 3):
        w = create_run_writer(tmp_path, ["console", "tensorboard", "jsonl", "csv"], stream=out)
        w.write_scalars(start, {"loss": 0.5 / start, "val/acc": 0.25 * start})
        w.write_scalars(start + 1, {"loss": 0.5 / (start + 1)})
        w.write_hparams({"lr": 0.1, "batch": 32}, {"val/acc": 0.75})
        w.close()
    assert read_scalars(tmp_path / "tb") == {
        "loss": [(1, 0.5), (2, 0.25), (3, 0.166667), (4, 0.125)],
        "val/acc": [(1, 0.25), (2, 0.75), (3, 0.75), (4, 0.75)],  # the final metrics at the last step, not at 0
    }
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= tags(tmp_path / "tb")
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r.get("step"), r.get("loss")) for r in rows] == [
        (1, 0.5),
        (2, 0.25),
        (2, None),  # the hyperparameters, at the last step written: a resume before it drops them with it
        (3, 0.5 / 3),
        (4, 0.125),
        (4, None),
    ]
    assert rows[2] == {"step": 2, "hparams": {"lr": 0.1, "batch": 32}, "metrics": {"val/acc": 0.75}}
    assert (tmp_path / "metrics.csv").read_text().splitlines() == [
        "step,name,value",
        "1,loss,0.5",
        "1,val/acc,0.25",
        "2,loss,0.25",
        "3,loss,0.16666666666666666",
        "3,val/acc,0.75",
        "4,loss,0.125",
    ]
    assert out.getvalue().splitlines()[:2] == ["step 1 | loss 0.5000 | val/acc 0.2500", out.getvalue().splitlines()[1]]
    assert out.getvalue().splitlines()[1].startswith("step 2 | ")
    assert out.getvalue().splitlines()[1].endswith("s/step | loss 0.2500")


def test_tensorboard_histograms_images_and_text(tmp_path):
    w = TensorBoardWriter(tmp_path)
    w.write_histogram(1, "weights", np.arange(10.0))
    w.write_image(1, "digit", np.zeros((8, 8, 1), np.uint8))
    w.write_text(1, "config", "lr: 0.1")
    w.close()
    assert tags(tmp_path) == {"weights", "digit", "config/text_summary"}


def test_console_formats_small_and_large_numbers():
    out = io.StringIO()
    ConsoleWriter(out).write_scalars(5, {"lr": 1e-4, "tokens": 2.5e6, "loss": 0.0})
    assert out.getvalue() == "step 5 | lr 1.0000e-04 | tokens 2.5000e+06 | loss 0.0000\n"


def test_multi_writer_fans_out_and_checks_its_writers(tmp_path):
    a, b = Remember(), CsvWriter(tmp_path / "m.csv")
    MultiWriter([a, b]).write_scalars(7, {"x": 1.0})
    b.close()
    assert a.calls == [("scalars", 7, {"x": 1.0})]
    assert (tmp_path / "m.csv").read_text().splitlines()[1] == "7,x,1.0"
    with pytest.raises(TypeError, match=r"`writers` must all be ember.writers.Writer instances, got \['nope'\]."):
        MultiWriter([a, "nope"])  # type: ignore[list-item]


def test_bad_arguments():
    with pytest.raises(TypeError, match=re.escape("`writer` must be an ember.writers.Writer, got int.")):
        AsyncWriter(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("`max_pending` must be a positive int, got 0.")):
        AsyncWriter(Remember(), max_pending=0)

    class Incomplete(Writer):
        pass

    with pytest.raises(NotImplementedError, match=r"^Incomplete must implement write_scalars\(step, values\)\.$"):
        Incomplete().write_scalars(1, {})
    with pytest.raises(TypeError, match="Protocols cannot be instantiated"):  # the contract, not a writer
        Writer()  # type: ignore[misc]


def test_jsonl_writer_text_and_missing_folder(tmp_path):
    w = JsonlWriter(tmp_path / "deep" / "log.jsonl")
    w.write_text(2, "note", "hello")
    w.close()
    row = json.loads((tmp_path / "deep" / "log.jsonl").read_text())
    assert (row["step"], row["text"]) == (2, {"note": "hello"})


def test_wandb_writer_offline_records_a_run_locally(tmp_path):
    """Offline W&B: scalars at merged steps, histogram, image, text and hparams, then a local run for sync."""
    from ember.writers import WandbWriter

    w = WandbWriter("ember-test", dir=tmp_path, config={"batch": 32}, settings={"silent": True})
    async_w = AsyncWriter(w)
    async_w.write_scalars(1, {"train/loss": jnp.float32(0.5)})
    async_w.write_scalars(1, {"val/acc": 0.75})
    async_w.write_histogram(2, "weights", np.arange(10.0))
    async_w.write_image(2, "digit", np.zeros((8, 8, 3), np.uint8))
    async_w.write_text(2, "note", "hello")
    async_w.write_hparams({"lr": 0.1}, {"best/acc": 0.9})
    async_w.flush()
    assert (w.run.summary["train/loss"], w.run.summary["val/acc"], w.run.summary["best/acc"]) == (0.5, 0.75, 0.9)
    assert (w.run.config["batch"], w.run.config["lr"]) == (32, 0.1)
    async_w.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert len(list(runs[0].glob("run-*.wandb"))) == 1
    with pytest.raises(ValueError, match=re.escape('`mode` must be "offline", "online" or "disabled", got \'cloud\'.')):
        WandbWriter(mode="cloud")


def test_confusion_matrix_image_goes_to_tensorboard(tmp_path):
    from ember.writers import confusion_matrix_image

    image = confusion_matrix_image(np.array([[9, 1, 0], [2, 7, 1], [0, 0, 10]]), ["a", "b", "c"], title="val")
    assert image.dtype == np.uint8
    assert image.ndim == 3
    assert image.shape[2] == 3
    assert image.min() < 100 < 250 <= image.max()  # dark cells on a light background
    w = TensorBoardWriter(tmp_path)
    w.write_image(5, "val/confusion", image)
    w.close()
    assert tags(tmp_path) == {"val/confusion"}
    with pytest.raises(ValueError, match=re.escape("`matrix` must be square (classes x classes), got shape (2, 3).")):
        confusion_matrix_image(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=re.escape("`class_names` must name the 2 classes, got 1 names.")):
        confusion_matrix_image(np.eye(2), ["a"])


def test_the_private_tensorboardx_api_the_writer_relies_on_is_there():
    """EventsWriter(file_prefix, filename_suffix), write_event/flush/close, Event's fields: fails if they move."""
    import inspect

    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto.event_pb2 import Event  # pyright: ignore[reportAttributeAccessIssue]  # generated

    from ember.writers._tensorboard import events_writer_class

    assert events_writer_class() is EventsWriter
    assert list(inspect.signature(EventsWriter).parameters) == ["file_prefix", "filename_suffix"]
    assert all(callable(getattr(EventsWriter, name, None)) for name in ("write_event", "flush", "close"))
    assert {"summary", "step", "wall_time"} <= {field.name for field in Event.DESCRIPTOR.fields}


def test_an_unchecked_tensorboardx_major_is_refused_by_name(monkeypatch):
    import tensorboardX

    from ember.writers._tensorboard import events_writer_class

    monkeypatch.setattr(tensorboardX, "__version__", "3.0.1")
    with pytest.raises(ImportError, match=re.escape("checked with tensorboardX 2.x; tensorboardX 3.0.1 is installed")):
        events_writer_class()


def test_event_files_of_one_process_sort_in_the_order_they_were_opened(tmp_path):
    """Twelve writers, one after another: TensorBoard reads the files by name, and gets them in order (10 > 9)."""
    for step in range(12):
        writer = TensorBoardWriter(tmp_path)
        writer.write_scalars(step, {"x": float(step)})
        writer.close()
    assert [step for step, _ in read_scalars(tmp_path)["x"]] == list(range(12))


def test_resume_at_rewrites_a_log_whole_or_not_at_all(tmp_path, monkeypatch):
    """A crash before the rename (here: os.replace failing) leaves the old file as it was; then the new one whole."""
    import json
    import os

    from ember.writers import CsvWriter, JsonlWriter

    jsonl, csv_path = JsonlWriter(tmp_path / "m.jsonl"), CsvWriter(tmp_path / "m.csv")
    for step in (10, 20, 30):
        jsonl.write_scalars(step, {"loss": step / 100})
        csv_path.write_scalars(step, {"loss": step / 100})
    jsonl.flush()
    before = (tmp_path / "m.jsonl").read_text()
    assert before.count("\n") == 3

    def crash(*_):
        raise OSError("killed before the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="killed before the rename"):
        jsonl.resume_at(20)
    assert (tmp_path / "m.jsonl").read_text() == before
    monkeypatch.undo()
    jsonl.resume_at(20)
    csv_path.resume_at(20)
    jsonl.write_scalars(30, {"loss": 0.5})
    csv_path.write_scalars(30, {"loss": 0.5})
    jsonl.close()
    csv_path.close()
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(10, 0.1), (20, 0.2), (30, 0.5)]
    assert (tmp_path / "m.csv").read_text() == "step,name,value\n10,loss,0.1\n20,loss,0.2\n30,loss,0.5\n"


def test_one_list_of_writer_names_for_create_run_writer_and_the_config():
    """WRITERS is the registry; ember train's config offers exactly its names (written out to import no JAX)."""
    import typing

    from ember.cli import Config
    from ember.writers import WRITERS

    allowed = typing.get_args(
        typing.get_args(typing.get_type_hints(typing.get_type_hints(Config)["handlers"])["writers"])[0]
    )
    assert allowed == tuple(WRITERS) == ("console", "tensorboard", "jsonl", "csv", "wandb", "mlflow")
    with pytest.raises(ValueError, match=re.escape("`writers` names ['tensorbord'], which are not writers; the")):
        create_run_writer("unused", ["tensorbord"])
    with pytest.raises(TypeError, match=re.escape("`writers` must be a list of names from ['console', 'tensor")):
        create_run_writer("unused", "jsonl")


def test_an_evaluation_job_s_writers_write_beside_the_run_s_and_its_own_wandb_run_joins_the_run_s_group(
    tmp_path, monkeypatch
):
    """``create_run_writer(evaluation=)``: files under eval/NAME, a W&B run ``<run's>-eval-NAME`` in the run's group."""
    from ember._run_identity import remember_tracker_run
    from ember.writers import WRITERS, create_run_writer
    from ember.writers._run import _EVALUATION_MAKERS
    from tests.writers.wandb_reader import records_with

    assert list(_EVALUATION_MAKERS) == list(WRITERS)  # every writer a run can name, an evaluation job can too
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    remember_tracker_run(run, "wandb", "abc123")
    w = create_run_writer(run, ["jsonl", "wandb"], evaluation="val_noisy")
    w.write_scalars(5, {"val_noisy/val/accuracy": 0.5})
    w.close()
    (row,) = map(json.loads, (run / "eval" / "val_noisy" / "metrics.jsonl").read_text().splitlines())
    assert (row["step"], row["val_noisy/val/accuracy"]) == (5, 0.5)
    (found,) = (run / "eval" / "val_noisy" / "wandb").rglob("run-*.wandb")
    (record,) = [r.run for r in records_with(found, "run") if r.HasField("run")]
    named = (record.run_id, record.run_group, record.display_name)
    assert named == ("abc123-eval-val_noisy", "abc123", "run/eval/val_noisy")
    assert not (run / "metrics.jsonl").exists()  # the training job's own files are its alone
    with pytest.raises(LookupError, match=re.escape(f"{run.resolve()} has no MLflow run in its run.json to log the")):
        create_run_writer(run, ["mlflow"], evaluation="val_noisy")
    message = "`evaluation` must be a name of letters, digits, '_', '.' and '-', got 'a/b'."
    with pytest.raises(ValueError, match=re.escape(message)):
        create_run_writer(run, ["jsonl"], evaluation="a/b")
