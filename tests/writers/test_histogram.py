"""Histograms counted on device: TensorBoard's exact buckets, W&B's and CLU's forms, and safe from donation."""

import re

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tensorboardX.summary import make_histogram

from ember import Events
from ember.training import TrainState, create_trainer
from ember.writers import AsyncWriter, CluWriter, Histogram, TensorBoardWriter, Writer, histogram, tensorboard_edges
from tests.writers.tb_reader import read_events

VALUES = np.concatenate(
    [
        np.random.default_rng(0).normal(scale=3.0, size=4096),
        [0.0, 0.0, -1e-13, 1e-13, 5e-13, -2.5, 2.5],  # zeros, the innermost buckets, values at or near edges
    ]
).astype(np.float32)


def proto_of(h: Histogram):
    limits, counts = h.on_host().trimmed()
    return limits.tolist(), counts.tolist()


@pytest.mark.parametrize("where", ["device", "host"])
def test_counts_and_limits_equal_tensorboardx_for_the_same_values(where):
    """On device (float32) or host: the buckets tensorboardX's make_histogram writes, exactly; sums to float32."""
    ref = make_histogram(VALUES.astype(float), tensorboard_edges())
    h = histogram(jnp.asarray(VALUES) if where == "device" else VALUES).on_host()
    limits, counts = proto_of(h)
    assert counts == list(ref.bucket)
    np.testing.assert_array_equal(limits, ref.bucket_limit)
    assert (float(h.min), float(h.max), int(h.num)) == (ref.min, ref.max, ref.num)
    assert float(h.sum) == pytest.approx(ref.sum, rel=1e-6)
    assert float(h.sum_squares) == pytest.approx(ref.sum_squares, rel=1e-6)


def test_the_tensorboard_writer_stores_a_device_histogram_as_tensorboardx_would(tmp_path):
    """Through the AsyncWriter: the event file holds tensorboardX's own proto for the same values."""
    writer = AsyncWriter(TensorBoardWriter(tmp_path))
    writer.write_histogram(3, "w", jnp.asarray(VALUES))
    writer.close()
    (value,) = [v for e in read_events(tmp_path) for v in e.summary.value if v.tag == "w"]
    ref = make_histogram(VALUES.astype(float), tensorboard_edges())
    assert list(value.histo.bucket) == list(ref.bucket)
    assert list(value.histo.bucket_limit) == list(ref.bucket_limit)
    assert (value.histo.min, value.histo.max, value.histo.num) == (ref.min, ref.max, ref.num)


@pytest.mark.parametrize("where", ["device", "host"])
def test_values_beyond_the_edges_count_in_num_and_in_no_bucket(where):
    """As numpy.histogram: 5 values, one above the last edge; the buckets hold 4, the last edge counts in its bucket."""
    values = np.array([0.5, 1.5, 2.0, 2.0, 7.0], np.float32)
    h = histogram(jnp.asarray(values) if where == "device" else values, edges=np.arange(3.0)).on_host()
    assert h.bucket_counts.tolist() == [1, 3]
    assert (int(h.num), float(h.max)) == (5, 7.0)


def test_numpy_form_merges_buckets_down_to_a_limit():
    """W&B takes at most 512 buckets: neighbours are merged, counts kept, outer edges kept."""
    h = histogram(np.arange(3000.0), edges=np.arange(3001.0)).on_host()
    counts, edges = h.numpy(max_buckets=512)
    assert len(counts) == 500  # 3000 buckets in groups of 6
    assert len(edges) == 501
    assert int(counts.sum()) == 3000
    assert (edges[0], edges[-1]) == (0.0, 3000.0)


def test_clu_gets_the_buckets_as_at_most_ten_thousand_midpoints():
    """A CLU MetricWriter takes raw values: each bucket's midpoint, repeated in proportion to its count."""
    got = {}

    class Fake:
        write_scalars = write_images = write_texts = write_hparams = flush = close = print

        def write_histograms(self, step, arrays, num_buckets=None):
            got.update(arrays)

    writer = CluWriter(Fake())
    h = histogram(np.concatenate([np.full(30_000, 0.5), np.full(10_000, 1.5)]), edges=np.arange(3.0))
    writer.write_histogram(1, "w", h)
    assert np.unique(got["w"], return_counts=True)[1].tolist() == [7500, 2500]
    assert np.unique(got["w"]).tolist() == [0.5, 1.5]


def test_edges_must_increase():
    """Bad edges are named with what was given."""
    with pytest.raises(ValueError, match=re.escape("`edges` must be an increasing 1-d sequence of at least 2 numbers")):
        histogram(np.ones(3), edges=[1.0, 1.0])


class Recorded(Writer):
    def __init__(self):
        self.rows = []

    def write_scalars(self, step, values):
        self.rows.append(("scalars", step, dict(values)))

    def write_histogram(self, step, name, values):
        self.rows.append(("histogram", step, name, values))

    def write_image(self, step, name, image):
        self.rows.append(("image", step, name, image))


def test_a_handler_may_hand_the_live_train_state_to_the_writer(tmp_path):
    """The handlers page's custom histogram: params handed over, the next step donates them; nothing is deleted."""
    state = TrainState.create(lambda p, x: x @ p["w"], {"w": jnp.ones((4, 3))}, optax.sgd(0.5))
    trainer = create_trainer(state, lambda m, b: jnp.mean(m(b) ** 2))
    recorded = Recorded()
    writer = AsyncWriter(recorded)
    seen = []

    @trainer.on(Events.ITERATION_COMPLETED)
    def log(engine):
        params = engine.state.train_state.params
        writer.write_histogram(engine.state.iteration, "w", params["w"])
        writer.write_scalars(engine.state.iteration, {"w00": params["w"][0, 0], "step": engine.state.train_state.step})
        writer.write_image(engine.state.iteration, "w", params["w"])
        seen.append(np.array(params["w"]))  # what the step left, read here (for the test only)

    trainer.run([jnp.ones((2, 4))] * 3)
    writer.close()
    scalars = [r for r in recorded.rows if r[0] == "scalars"]
    assert [(r[1], r[2]["step"]) for r in scalars] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert [r[2]["w00"] for r in scalars] == [float(w[0, 0]) for w in seen]
    for row, w in zip([r for r in recorded.rows if r[0] == "histogram"], seen, strict=True):
        assert isinstance(row[3], Histogram)
        assert float(row[3].sum) == pytest.approx(float(w.sum()), rel=1e-6)
    for row, w in zip([r for r in recorded.rows if r[0] == "image"], seen, strict=True):
        np.testing.assert_array_equal(row[3], w)
