import numpy as np
import pytest

from ember.data import ArrayDataset, DevicePrefetch


def test_prefetch_puts_batches_ahead_in_order():
    """With size=2 the third batch is already transferred when the first is handed out."""
    put = []
    data = DevicePrefetch([1, 2, 3, 4], put=lambda b: put.append(b) or b * 10, size=2)
    it = iter(data)
    assert next(it) == 10
    assert put == [1, 2, 3]
    assert list(it) == [20, 30, 40]


def test_size_zero_transfers_on_demand():
    """size=0 puts each batch only when it is asked for."""
    put = []
    it = iter(DevicePrefetch([1, 2, 3], put=lambda b: put.append(b) or b, size=0))
    next(it)
    assert put == [1]
    assert list(it) == [2, 3]
    assert put == [1, 2, 3]


def test_decide_sets_the_size_from_the_first_batch_of_each_pass():
    """`decide` sees the first batch before it is put; its answer is how far ahead the pass reads."""
    seen, put = [], []
    data = DevicePrefetch([5, 6, 7, 8], put=lambda b: put.append(b) or b, size=0, decide=lambda b: seen.append(b) or 2)
    it = iter(data)
    assert next(it) == 5
    assert (seen, put, data.size) == ([5], [5, 6, 7], 2)
    assert list(it) == [6, 7, 8]
    data.decide = lambda b: 0
    it = iter(data)
    next(it)
    assert data.size == 0  # a new pass decides again: now on demand
    assert put[-1] == 5


def test_position_reports_what_was_handed_out_not_read_ahead():
    """The saved position is the one after the batches handed out; resuming from it is exact."""
    data = DevicePrefetch(ArrayDataset(np.arange(10), batch_size=1), put=lambda b: b, size=3)
    it = iter(data)
    got = [int(next(it)[0]) for _ in range(4)]
    assert it._it.get_state()["position"] == 7  # the source's iterator has read three ahead
    assert it.get_state()["position"] == 4
    resumed = iter(DevicePrefetch(ArrayDataset(np.arange(10), batch_size=1), put=lambda b: b, size=3))
    resumed.set_state(it.get_state())
    assert got + [int(b[0]) for b in resumed] == list(range(10))


def test_sources_without_a_position_report_none():
    """A plain list has no position to save; get_state() says None, set_state() refuses, len() still works."""
    data = DevicePrefetch([1, 2], put=lambda b: b)
    it = iter(data)
    assert it.get_state() is None
    with pytest.raises(TypeError, match=r"This data's iterator \(list_iterator\) has no set_state\(\) to restore"):
        it.set_state({"position": 1})
    assert len(data) == 2
    with pytest.raises(ValueError, match=r"`size` must be a non-negative int, got -1"):
        DevicePrefetch([1], put=lambda b: b, size=-1)
    with pytest.raises(TypeError, match=r"`source` must be an iterable of batches, got int"):
        DevicePrefetch(3, put=lambda b: b)  # type: ignore[arg-type]
