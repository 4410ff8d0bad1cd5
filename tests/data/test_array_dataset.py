import re

import numpy as np
import pytest

from ember import Engine, Events
from ember.data import ArrayDataset


def xs(data):
    return [b["x"].tolist() for b in data]


def flat(batches):
    return [v for batch in batches for v in batch]


def test_batches_in_order_with_a_short_last_batch_or_dropped():
    """Without shuffling batches come in order; the short last batch is kept or dropped."""
    arrays = {"x": np.arange(10), "y": np.arange(10) * 2}
    assert xs(ArrayDataset(arrays, batch_size=4)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert len(ArrayDataset(arrays, batch_size=4)) == 3
    assert xs(ArrayDataset(arrays, batch_size=4, drop_remainder=True)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    first = next(iter(ArrayDataset(arrays, batch_size=4)))
    assert first["y"].tolist() == [0, 2, 4, 6]


def test_shuffling_is_seeded_and_differs_per_pass():
    """The same seed gives the same passes; each pass is a different permutation of all examples."""
    a, b = (ArrayDataset({"x": np.arange(12)}, batch_size=4, shuffle=True, seed=5) for _ in range(2))
    passes_a = [flat(xs(a)) for _ in range(3)]
    passes_b = [flat(xs(b)) for _ in range(3)]
    assert passes_a == passes_b
    assert passes_a[0] != passes_a[1]
    assert all(sorted(p) == list(range(12)) for p in passes_a)
    other = ArrayDataset({"x": np.arange(12)}, batch_size=4, shuffle=True, seed=6)
    assert flat(xs(other)) != passes_a[0]


def test_position_round_trips_mid_pass():
    """An iterator set to a saved position continues with exactly the batches the original would give."""
    data = ArrayDataset({"x": np.arange(12)}, batch_size=3, shuffle=True, seed=1)
    list(data)
    it = iter(data)
    next(it)
    saved = it.get_state()
    rest = [b["x"].tolist() for b in it]
    restored = iter(ArrayDataset({"x": np.arange(12)}, batch_size=3, shuffle=True, seed=1))
    restored.set_state(saved)
    assert saved == {"epoch": 1, "position": 1, "examples": 12, "batch_size": 3, "shuffle": True, "seed": 1}
    assert [b["x"].tolist() for b in restored] == rest


def test_invalid_arguments():
    """Mismatched lengths, bad batch sizes and bad positions are refused with clear errors."""
    with pytest.raises(ValueError, match=r"share their leading axis length; got lengths \[3, 4\]"):
        ArrayDataset({"x": np.arange(3), "y": np.arange(4)}, batch_size=2)
    with pytest.raises(ValueError, match=r"`batch_size` must be a positive int, got 0"):
        ArrayDataset(np.arange(3), batch_size=0)
    with pytest.raises(ValueError, match=r"`batch_size`=8 exceeds the 3 examples and drop_remainder=True"):
        ArrayDataset(np.arange(3), batch_size=8, drop_remainder=True)
    with pytest.raises(ValueError, match=r"must be an array with a leading \(example\) axis; got a scalar leaf"):
        ArrayDataset([1, 2, 3], batch_size=2)
    with pytest.raises(ValueError, match=r"`arrays` holds no arrays"):
        ArrayDataset({}, batch_size=2)
    data = ArrayDataset(np.arange(6), batch_size=2)
    it = iter(data)
    with pytest.raises(ValueError, match=r"position 9 is outside this dataset's 3 batches per pass"):
        it.set_state({**it.get_state(), "position": 9})
    with pytest.raises(ValueError, match=r"must hold int 'epoch' and 'position'"):
        it.set_state({"epoch": 0})
    assert repr(data) == "ArrayDataset(6 examples, batch_size=2, shuffle=False, seed=0, drop_remainder=False)"


def test_shards_split_every_global_batch_between_processes():
    """Two shards of a shuffled dataset together give exactly the unsharded dataset's batches, in order."""
    arrays = {"x": np.arange(20)}
    whole = ArrayDataset(arrays, batch_size=8, shuffle=True, seed=4, drop_remainder=True, shard=(0, 1))
    parts = [
        ArrayDataset(arrays, batch_size=8, shuffle=True, seed=4, drop_remainder=True, shard=(i, 2)) for i in (0, 1)
    ]
    for _ in range(2):  # two epochs: each pass reshuffles identically on every process
        expected = [b["x"].tolist() for b in whole]
        got = [a["x"].tolist() + b["x"].tolist() for a, b in zip(*parts, strict=True)]
        assert got == expected
    assert ArrayDataset(arrays, batch_size=8).shard == (0, 1)  # "auto" in a single process


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shard": (2, 2)}, '`shard` must be "auto" or (index, count) with 0 <= index < count, got (2, 2).'),
        (
            {"shard": (0, 3), "drop_remainder": True},
            "With `shard`=(0, 3) and drop_remainder=True (training), `batch_size` (the global batch, 8) must divide "
            "by 3",
        ),
    ],
)
def test_bad_shards(kwargs, message):
    args = {"batch_size": 8, "drop_remainder": True, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        ArrayDataset({"x": np.arange(20)}, **args)


def test_set_epoch_picks_the_pass_of_the_next_iteration():
    """set_epoch(e) makes the next iter() start pass e from its first batch; later passes follow it."""
    data = ArrayDataset(np.arange(6), batch_size=3, shuffle=True, seed=2)
    passes = [[b.tolist() for b in data] for _ in range(3)]
    data.set_epoch(1)
    assert [b.tolist() for b in data] == passes[1]
    assert [b.tolist() for b in data] == passes[2]
    with pytest.raises(ValueError, match=re.escape("`epoch` must be a non-negative int, got -1.")):
        data.set_epoch(-1)


def test_each_iterator_reports_its_own_position():
    """Two iterators over one dataset each know where they are."""
    data = ArrayDataset(np.arange(8), batch_size=2, shuffle=True)
    first = iter(data)
    next(first)
    data.set_epoch(5)
    second = iter(data)
    next(second), next(second), next(second)
    next(first)
    assert (first.get_state()["epoch"], first.get_state()["position"]) == (0, 2)
    assert (second.get_state()["epoch"], second.get_state()["position"]) == (5, 3)


def test_a_position_saved_for_other_data_is_refused():
    """Restoring onto data with another seed, batch size or length names what differs."""
    it = iter(ArrayDataset(np.arange(8), batch_size=2, shuffle=True, seed=1))
    next(it)
    saved = it.get_state()
    other = iter(ArrayDataset(np.arange(10), batch_size=2, shuffle=True, seed=2))
    with pytest.raises(
        ValueError, match=re.escape("The saved position is for other data: examples 8 (now 10), seed 1 (now 2).")
    ):
        other.set_state(saved)


def _trainer_batches(data, *, evaluate_every=None, resume_at=None):
    """The batches a trainer Engine gets over 3 epochs; an evaluator Engine iterates the same data."""
    trainer, evaluator = Engine(lambda e, b: b.tolist()), Engine(lambda e, b: None)
    if evaluate_every is not None:
        trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: evaluator.run(data))
        trainer.add_event_handler(Events.ITERATION_COMPLETED(every=evaluate_every), lambda: evaluator.run(data))
    seen, saved = [], []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(e.state.output))
    if resume_at is not None:
        trainer.add_event_handler(Events.ITERATION_COMPLETED(once=resume_at), lambda e: saved.append(e.state_dict()))
    trainer.run(data, max_epochs=3)
    return seen, saved


def test_an_evaluator_over_the_training_data_does_not_change_the_trainers_order():
    """A trainer's shuffled batches, and its saved position, depend only on its own iterations."""
    alone, _ = _trainer_batches(ArrayDataset(np.arange(12), batch_size=3, shuffle=True, seed=1))
    shared = ArrayDataset(np.arange(12), batch_size=3, shuffle=True, seed=1)
    with_eval, saved = _trainer_batches(shared, evaluate_every=3, resume_at=6)
    assert with_eval == alone
    assert (saved[0]["data"]["epoch"], saved[0]["data"]["position"]) == (1, 2)  # the trainer's, not the evaluator's
    resumed = Engine(lambda e, b: b.tolist())
    resumed.load_state_dict(saved[0])
    rest: list[list[int]] = []
    resumed.add_event_handler(Events.ITERATION_COMPLETED, lambda e: rest.append(e.state.output))
    resumed.run(ArrayDataset(np.arange(12), batch_size=3, shuffle=True, seed=1))
    assert rest == alone[6:]


@pytest.mark.parametrize(("examples", "batch_size", "count"), [(359, 359, 2), (10, 4, 3), (5, 2, 4)])
def test_an_evaluation_set_split_over_processes_covers_every_example_once_masked(examples, batch_size, count):
    """drop_remainder=False with several processes: parts of one size per batch; the real ones, together, are all."""
    from ember.data import Masked

    seen = []
    parts = [list(ArrayDataset(np.arange(examples), batch_size=batch_size, shard=(i, count))) for i in range(count)]
    for batch in zip(*parts, strict=True):  # the same batch on every process
        assert all(isinstance(part, Masked) for part in batch)
        assert len({len(part.batch) for part in batch}) == 1  # one size: the global array is count x part
        for part in batch:
            seen += part.batch[part.mask].tolist()
    assert sorted(seen) == list(range(examples))


def test_a_position_saved_at_the_end_of_a_pass_is_accepted_and_the_bounds_are_exact():
    """Position 3 of 3 batches (the pass just ended) restores to an exhausted pass; 4 and -1 are refused."""
    data = ArrayDataset(np.arange(6), batch_size=2)
    identity = {"examples": 6, "batch_size": 2, "shuffle": False, "seed": 0}
    it = iter(data)
    it.set_state({"epoch": 0, "position": 3, **identity})
    assert [b.tolist() for b in it] == []
    for bad in (4, -1):
        with pytest.raises(ValueError, match=re.escape(f"`state` position {bad} is outside this dataset's 3 batches")):
            iter(data).set_state({"epoch": 0, "position": bad, **identity})
