"""NpySource: records read from .npy files as asked for; a data set larger than the memory budget trains flat."""

import pickle
import re

import numpy as np
import pytest

from ember import Engine, Events
from ember.data import GrainPipeline, NpySource
from ember.errors import RecordError


def rss_mib() -> float:
    """This process's resident memory now (not its peak), in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def write_data(folder, examples: int, width: int) -> None:
    """x: ``examples`` x ``width`` float32, written in chunks so writing it does not need the memory either."""
    x = np.lib.format.open_memmap(folder / "x.npy", mode="w+", dtype=np.float32, shape=(examples, width))
    for start in range(0, examples, 8192):
        stop = min(start + 8192, examples)
        x[start:stop] = np.arange(start, stop, dtype=np.float32)[:, None]
    x.flush()
    del x
    np.save(folder / "y.npy", np.arange(examples, dtype=np.int32) % 10)


@pytest.mark.parametrize(
    ("examples", "budget_mib"),
    [
        (50_000, 16),  # a 49 MiB file, three times the budget
        pytest.param(1_500_000, 64, marks=pytest.mark.slow),  # 1.4 GiB, 22 times the budget
    ],
)
def test_an_epoch_over_data_larger_than_the_budget_keeps_memory_flat(tmp_path, examples, budget_mib):
    """One full epoch through a GrainPipeline: resident memory grows by less than the budget, far below the file."""
    write_data(tmp_path, examples, 256)
    size_mib = (tmp_path / "x.npy").stat().st_size / 2**20
    assert size_mib > 3 * budget_mib
    data = GrainPipeline(NpySource(tmp_path), batch_size=500, shuffle=True, seed=0)
    engine = Engine(lambda e, b: float(b["x"][0, 0]) + int(b["y"][0]))
    peak, seen = [], set()
    engine.add_event_handler(Events.ITERATION_COMPLETED(every=10), lambda: peak.append(rss_mib()))
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.add(e.state.output))
    start = rss_mib()
    engine.run(data, max_epochs=1)
    assert engine.state.iteration == examples // 500
    assert max(peak) - start < budget_mib, f"grew {max(peak) - start:.1f} MiB over a {size_mib:.0f} MiB file"


def test_records_are_read_exactly_and_errors_name_the_record(tmp_path):
    write_data(tmp_path, 100, 3)
    source = NpySource({"x": tmp_path / "x.npy", "y": tmp_path / "y.npy"})
    assert len(source) == 100
    record = source[42]
    assert record["x"].tolist() == [42.0, 42.0, 42.0]
    assert int(record["y"]) == 2
    again = pickle.loads(pickle.dumps(source))  # what a worker process gets: the paths, not the data
    assert len(pickle.dumps(source)) < 1000
    assert again[99]["x"].tolist() == [99.0, 99.0, 99.0]
    with pytest.raises(IndexError, match=re.escape("record 100 is out of range for 100 records")):
        source[100]
    with open(tmp_path / "x.npy", "r+b") as f:  # the file loses its end: the last record cannot be read
        f.truncate(f.seek(0, 2) - 4)
    with pytest.raises(
        RecordError, match=r"^record 99 of NpySource\(.*\) could not be read: OSError\(.*ended 4 bytes early"
    ) as e:
        NpySource(tmp_path)[99]
    assert e.value.index == 99


def test_bad_paths_are_named(tmp_path):
    with pytest.raises(
        ValueError, match=re.escape(f"`paths` names the folder {str(tmp_path)!r}, which holds no .npy files.")
    ):
        NpySource(tmp_path)
    np.save(tmp_path / "a.npy", np.zeros((4, 2)))
    np.save(tmp_path / "b.npy", np.zeros((5,)))
    with pytest.raises(
        ValueError, match=re.escape("Every array must have the same length on axis 0; got {'a': 4, 'b': 5}.")
    ):
        NpySource(tmp_path)
    (tmp_path / "c.npy").write_text("not an array")
    with pytest.raises(ValueError, match=r"`paths\['c'\]` = '.*c.npy' is not a readable .npy file"):
        NpySource({"c": tmp_path / "c.npy"})
