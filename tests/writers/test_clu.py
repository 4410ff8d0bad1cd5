"""ember's writers and CLU's, each where the other is expected, against CLU's own MetricWriter interface.

CLU's ``clu.metric_writers`` package imports TensorFlow when imported; its interface module does not, so the
test loads ``clu/metric_writers/interface.py`` (the abstract ``MetricWriter``) from the installed CLU by path.
"""

import importlib.util
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from ember import Engine, Events
from ember.handlers import ScalarLogger
from ember.writers import CluWriter, MetricWriterAdapter, Writer, as_clu_writer


def clu_metric_writer_class():
    spec = importlib.util.find_spec("clu")
    path = Path(spec.origin).parent / "metric_writers" / "interface.py"
    module_spec = importlib.util.spec_from_file_location("clu_interface_for_tests", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.MetricWriter


MetricWriter = clu_metric_writer_class()


class RecordingCluWriter(MetricWriter):
    """A complete CLU MetricWriter (all its abstract methods) that records its calls."""

    def __init__(self):
        self.calls = []

    def write_summaries(self, step, values, metadata=None):
        self.calls.append(("summaries", step, dict(values)))

    def write_scalars(self, step, scalars):
        self.calls.append(("scalars", step, dict(scalars)))

    def write_images(self, step, images):
        self.calls.append(("images", step, {k: np.asarray(v).shape for k, v in images.items()}))

    def write_videos(self, step, videos):
        self.calls.append(("videos", step, videos))

    def write_audios(self, step, audios, *, sample_rate):
        self.calls.append(("audios", step, audios))

    def write_texts(self, step, texts):
        self.calls.append(("texts", step, dict(texts)))

    def write_histograms(self, step, arrays, num_buckets=None):
        self.calls.append(("histograms", step, {k: np.asarray(v).tolist() for k, v in arrays.items()}))

    def write_hparams(self, hparams):
        self.calls.append(("hparams", dict(hparams)))

    def flush(self):
        self.calls.append(("flush",))

    def close(self):
        self.calls.append(("close",))


class RecordingWriter(Writer):
    def __init__(self):
        self.calls = []

    def write_scalars(self, step, values):
        self.calls.append(("scalars", step, dict(values)))

    def write_histogram(self, step, name, values):
        self.calls.append(("histogram", step, name, np.asarray(values).tolist()))

    def write_image(self, step, name, image):
        self.calls.append(("image", step, name, np.asarray(image).shape))

    def write_text(self, step, name, text):
        self.calls.append(("text", step, name, text))

    def write_hparams(self, hparams, metrics=None):
        self.calls.append(("hparams", dict(hparams), metrics))


def test_a_clu_writer_under_embers_loggers():
    clu = RecordingCluWriter()
    writer = CluWriter(clu)
    engine = Engine(lambda e, b: {"loss": float(b)})
    ScalarLogger(writer, tag="train", output_keys=["loss"]).attach(engine, Events.ITERATION_COMPLETED(every=2))
    engine.run([1.0, 2.0, 3.0, 4.0])
    writer.write_histogram(4, "w", [1.0, 2.0])
    writer.write_image(4, "digit", np.zeros((8, 8, 1)))
    writer.write_text(4, "note", "done")
    writer.write_hparams({"lr": 0.1}, {"best": 0.9})
    writer.close()
    assert clu.calls == [
        ("scalars", 2, {"train/loss": 2.0}),
        ("scalars", 4, {"train/loss": 4.0}),
        ("flush",),  # ember's logger flushes its writer at COMPLETED
        ("histograms", 4, {"w": [1.0, 2.0]}),
        ("images", 4, {"digit": (1, 8, 8, 1)}),
        ("texts", 4, {"note": "done"}),
        ("hparams", {"lr": 0.1}),
        ("scalars", 4, {"best": 0.9}),
        ("close",),
    ]
    with pytest.raises(TypeError, match=re.escape("`metric_writer` must be a CLU MetricWriter; object lacks")):
        CluWriter(object())


def test_an_ember_writer_where_clu_code_expects_a_metric_writer():
    ember_writer = RecordingWriter()
    adapter = as_clu_writer(ember_writer)
    for name in MetricWriter.__abstractmethods__:  # every method CLU's interface requires, with its parameters
        ours, theirs = inspect.signature(getattr(adapter, name)), inspect.signature(getattr(MetricWriter, name))
        assert list(ours.parameters) == [p for p in theirs.parameters if p != "self"], name
    MetricWriter.register(MetricWriterAdapter)  # what as_clu_writer does where CLU itself imports
    assert isinstance(adapter, MetricWriter)
    adapter.write_scalars(1, {"loss": 0.5})
    adapter.write_images(1, {"batch": np.zeros((2, 4, 4, 3)), "one": np.zeros((4, 4, 3))})
    adapter.write_texts(1, {"note": "hi"})
    adapter.write_histograms(1, {"w": np.array([1.0, 3.0])}, num_buckets={"w": 10})
    adapter.write_summaries(2, {"acc": np.array(0.75), "h": np.array([1.0])})
    adapter.write_hparams({"lr": 0.1})
    assert ember_writer.calls == [
        ("scalars", 1, {"loss": 0.5}),
        ("image", 1, "batch/0", (4, 4, 3)),
        ("image", 1, "batch/1", (4, 4, 3)),
        ("image", 1, "one", (4, 4, 3)),
        ("text", 1, "note", "hi"),
        ("histogram", 1, "w", [1.0, 3.0]),
        ("scalars", 2, {"acc": 0.75}),
        ("histogram", 2, "h", [1.0]),
        ("hparams", {"lr": 0.1}, None),
    ]
    with pytest.raises(
        NotImplementedError, match=re.escape("ember's writers take no video; ['clip'] were not written.")
    ):
        adapter.write_videos(1, {"clip": np.zeros((1, 2, 4, 4, 3))})
