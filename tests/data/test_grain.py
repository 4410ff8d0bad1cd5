"""Grain pipelines in a run: exact resume, worker processes stopped, bad records named, mismatches refused."""

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from ember import Engine, Events
from ember.data import ArrayDataset, GrainPipeline, NpySource
from ember.errors import RecordError
from ember.handlers import Checkpoint, Preemption, load_objects
from ember.training import TrainState, create_trainer
from tests.data.grain_parts import BadRecord, Jitter, normalise
from tests.subprocesses import PYTHONPATH
from tests.training.models import LinenNet, batches, classification_loss

ARRAYS = {
    "x": np.concatenate([b["x"] for b in batches(4)]).astype(np.float32),
    "y": np.concatenate([b["y"] for b in batches(4)]).astype(np.int32),
}  # 64 examples: 4 batches of 16 an epoch


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("npy")
    for name, array in ARRAYS.items():
        np.save(folder / f"{name}.npy", array)
    return NpySource(folder)


def pipeline(source, workers=0, seed=3):
    return GrainPipeline(
        source, batch_size=16, transforms=[normalise, Jitter()], shuffle=True, seed=seed, worker_count=workers
    )


def new_trainer():
    state = TrainState.from_linen(LinenNet(), ARRAYS["x"][:2], optax.adam(1e-2), seed=0, rngs=("dropout",))
    return create_trainer(state, classification_loss)


_before: set[str] = set()  # the pids of this process's children when the current test began


@pytest.fixture(autouse=True)
def _own_children_only():
    """Record the children already running (another test's, say) so that `children` counts this test's alone."""
    _before.clear()
    _before.update(pid for pid, _ in _child_processes())


def _child_processes() -> list[tuple[str, str]]:
    """``(pid, command line)`` of this process's live children; a zombie (exited, not yet reaped) is not one."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            state, ppid = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            if int(ppid) == os.getpid() and state != "Z":
                found.append((proc.name, (proc / "cmdline").read_text().replace("\0", " ")))
        except (FileNotFoundError, ProcessLookupError):  # it exited while we looked
            continue
    return found


def children() -> list[str]:
    """The live child processes this test started (Grain's workers), by command line.

    Multiprocessing's resource tracker is left out, and so is a process another test left running.
    """
    return [c for pid, c in _child_processes() if pid not in _before and "resource_tracker" not in c]


def assert_params_equal(a, b):
    for x, y in zip(jax.tree.leaves(a.state.train_state), jax.tree.leaves(b.state.train_state), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def straight(source):
    """12 steps straight, in this process (workers change where examples are read, not what they are)."""
    trainer = new_trainer()
    trainer.run(pipeline(source), max_epochs=3)
    return trainer


@pytest.mark.parametrize(
    ("stop_at", "workers"),
    [(6, 0), (8, 0), (6, 2)],  # mid-epoch and at an epoch boundary in this process; mid-epoch with 2 workers
)
def test_a_stopped_run_resumes_bit_for_bit(tmp_path, source, straight, stop_at, workers):
    """K steps, a checkpoint, a new trainer resumed from it for the rest: every parameter equals 12 straight steps."""
    first = new_trainer()
    saver = Checkpoint({"trainer": first}, tmp_path, n_saved=1)
    saver.attach(first, Events.ITERATION_COMPLETED(every=2))
    first.add_event_handler(Events.ITERATION_COMPLETED(once=stop_at), lambda e: e.terminate(final=False))
    first.run(pipeline(source, workers), max_epochs=3)
    assert children() == []  # the run stopped: its workers are gone

    second = new_trainer()
    assert load_objects({"trainer": second}, tmp_path).step == stop_at
    second.run(pipeline(source, workers))
    assert second.state.iteration == 12
    assert_params_equal(second, straight)


def test_workers_run_during_the_run_and_stop_however_it_ends(tmp_path, source):
    """Two workers while the run goes on; none after COMPLETED, an exception, terminate() or a SIGTERM."""
    seen = []

    def run(engine_setup, **kwargs):
        engine = Engine(lambda e, b: b)
        engine.add_event_handler(Events.ITERATION_COMPLETED(once=2), lambda: seen.append(len(children())))
        if engine_setup(engine) == "fails":
            with pytest.raises(RuntimeError, match=r"^failed at 3$"):
                engine.run(pipeline(source, workers=2), **kwargs)
        else:
            engine.run(pipeline(source, workers=2), **kwargs)
        return len(children())

    def fail(engine):
        def boom():
            raise RuntimeError("failed at 3")

        engine.add_event_handler(Events.ITERATION_COMPLETED(once=3), boom)
        return "fails"

    def preempt(engine):
        Preemption(Checkpoint({"trainer": engine}, tmp_path)).attach(engine)
        engine.add_event_handler(Events.ITERATION_COMPLETED(once=3), lambda: os.kill(os.getpid(), signal.SIGTERM))

    after = [
        run(lambda t: None, max_iters=4),
        run(fail, max_epochs=1),
        run(lambda t: t.add_event_handler(Events.ITERATION_COMPLETED(once=3), t.terminate), max_epochs=2),
        run(preempt, max_epochs=2),
    ]
    assert seen == [2, 2, 2, 2]
    assert after == [0, 0, 0, 0]


def test_an_unfinished_iterator_does_not_hold_up_interpreter_exit(tmp_path, source):
    """A script that leaves a run with workers mid-epoch (an exception escapes) still exits promptly."""
    script = tmp_path / "exit.py"
    script.write_text(
        textwrap.dedent(f"""
            from ember import Engine, Events
            from ember.data import ArrayDataset, GrainPipeline, NpySource
            from tests.data.grain_parts import normalise

            if __name__ == "__main__":
                data = GrainPipeline(NpySource({str(source.paths["x"].parent)!r}), batch_size=16,
                                     transforms=[normalise], worker_count=2)
                engine = Engine(lambda e, b: b)
                it = engine.iterate(data, Events.ITERATION_COMPLETED, max_epochs=2)
                next(it)
                print("left with workers running", flush=True)
        """)
    )
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "left with workers running\n"


def test_a_bad_record_fails_the_run_naming_it_and_keeps_the_last_checkpoint(tmp_path):
    """A worker that cannot read record 21: RecordError names it and the original error; checkpoints stay valid."""
    data = GrainPipeline(BadRecord(ARRAYS, bad=21), batch_size=16, worker_count=2)  # in order: record 21 is in batch 2
    trainer = new_trainer()
    saver = Checkpoint({"trainer": trainer}, tmp_path, n_saved=2)
    saver.attach(trainer, Events.ITERATION_COMPLETED)
    with pytest.raises(RecordError) as caught:
        trainer.run(data)
    assert caught.value.index == 21
    assert str(caught.value) == ("record 21 of BadRecord(bad=21) failed: ValueError('checksum mismatch in record 21')")
    assert "(raised by the data, fetching the batch of iteration 2)" in caught.value.__notes__
    assert [c.step for c in saver.store.checkpoints()] == [1]
    assert load_objects({"trainer": new_trainer()}, tmp_path).step == 1
    assert children() == []


def test_a_position_from_another_pipeline_is_refused(tmp_path, source):
    """Resuming onto a pipeline with another seed names the difference, rather than restarting from zero."""
    first = new_trainer()
    Checkpoint({"trainer": first}, tmp_path).attach(first, Events.ITERATION_COMPLETED(once=2))
    first.run(pipeline(source, seed=1), max_iters=2)
    second = new_trainer()
    load_objects({"trainer": second}, tmp_path)
    with pytest.raises(ValueError, match=re.escape("The saved position is for another pipeline: seed 1 (now 2).")):
        second.run(pipeline(source, seed=2), max_iters=4)


def test_any_grain_dataset_runs_and_resumes_as_it_is():
    """A plain grain.MapDataset pipeline, no ember wrapper: the engine saves and restores Grain's own state."""
    import grain

    ds = grain.MapDataset.range(20).shuffle(seed=0).batch(4)
    straight = Engine(lambda e, b: b.tolist())
    seen = []
    straight.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(e.state.output))
    straight.run(ds, max_epochs=2)
    first = Engine(lambda e, b: b)
    first.add_event_handler(Events.ITERATION_COMPLETED(once=3), lambda e: e.terminate(final=False))
    first.run(ds, max_epochs=2)
    assert first.state_dict()["data"] == {"next_index": 3}
    rest = []
    second = Engine(lambda e, b: b.tolist())
    second.add_event_handler(Events.ITERATION_COMPLETED, lambda e: rest.append(e.state.output))
    second.load_state_dict(first.state_dict())
    second.run(ds)
    assert seen[3:] == rest


def test_bad_arguments_are_named(source):
    with pytest.raises(
        ValueError, match=re.escape("`batch_size` (the global batch, 10) must divide by the 4 processes")
    ):
        GrainPipeline(source, batch_size=10, shard=(0, 4))
    with pytest.raises(TypeError, match=re.escape("`source` must support len() and [index] (random access), got int")):
        GrainPipeline(3, batch_size=2)
    with pytest.raises(ValueError, match=re.escape("`batch_size`=128 exceeds the 64 examples of `source`.")):
        GrainPipeline(source, batch_size=128)
    with pytest.raises(TypeError, match=re.escape("`transforms[0]` must be a callable, grain.transforms.Map or")):
        GrainPipeline(source, batch_size=16, transforms=[3])


def test_the_batches_are_array_datasets_and_shards_split_them():
    """Same seed, same batches as ArrayDataset over 3 passes; two shards together give the one-process batches."""
    arrays = {"x": np.arange(40)}
    records = [{"x": np.int64(i)} for i in range(40)]
    expected = ArrayDataset(arrays, batch_size=8, shuffle=True, seed=5, drop_remainder=True)
    want = [b["x"].tolist() for _ in range(3) for b in expected]
    whole = GrainPipeline(records, batch_size=8, shuffle=True, seed=5)
    assert [b["x"].tolist() for b, _ in zip(whole, range(15), strict=False)] == want
    parts = [GrainPipeline(records, batch_size=8, shuffle=True, seed=5, shard=(i, 2)) for i in (0, 1)]
    got = [a["x"].tolist() + b["x"].tolist() for a, b, _ in zip(*parts, range(15), strict=False)]
    assert got == want


def test_epochs_follow_ignite_a_finite_loader_ends_one_an_endless_one_needs_epoch_length():
    """A one-pass Grain DataLoader ends each epoch (DATALOADER_STOP_ITERATION between); endless data needs a length."""
    import grain

    loader = grain.DataLoader(
        data_source=list(range(10)),
        sampler=grain.samplers.IndexSampler(10, shard_options=grain.sharding.NoSharding(), num_epochs=1),
        operations=[grain.transforms.Batch(4)],
    )
    engine = Engine(lambda e, b: b.tolist())
    events = []
    for event in (Events.EPOCH_COMPLETED, Events.DATALOADER_STOP_ITERATION):
        engine.add_event_handler(event, lambda e, name=event.name: events.append((name, e.state.iteration)))
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: events.append(e.state.output))
    engine.run(loader, max_epochs=2)
    assert events == [
        *([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]),
        ("EPOCH_COMPLETED", 3),
        ("DATALOADER_STOP_ITERATION", 3),
        *([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]),
        ("EPOCH_COMPLETED", 6),
    ]
    endless = grain.MapDataset.range(10).repeat().batch(4)
    with pytest.raises(
        ValueError,
        match=re.escape("`data` is endless (its len() is 2305843009213693952, as Grain's repeat() makes it)"),
    ):
        Engine(lambda e, b: b).run(endless)
    assert Engine(lambda e, b: b).run(endless, epoch_length=3, max_epochs=2).iteration == 6


def test_every_pass_is_a_new_permutation_of_the_records():
    """Every pass is a permutation of all records, no two of 5 passes alike, another seed another order."""
    records = [{"x": np.int64(i)} for i in range(30)]
    data = GrainPipeline(records, batch_size=6, shuffle=True, seed=7)
    stream = [int(v) for b, _ in zip(data, range(25), strict=False) for v in b["x"]]
    passes = [stream[i * 30 : (i + 1) * 30] for i in range(5)]
    for p in passes:
        assert sorted(p) == list(range(30))  # a permutation: every record once (30 divides by 6: none dropped)
    assert len({tuple(p) for p in passes}) == 5
    other = GrainPipeline(records, batch_size=6, shuffle=True, seed=8)
    assert [int(v) for b, _ in zip(other, range(5), strict=False) for v in b["x"]] != passes[0]


def test_a_random_transform_gives_a_record_a_new_draw_each_pass_and_the_same_one_on_a_resumed_pass(source):
    """Jitter through 2 workers, no shuffle: each record's draw differs between passes and is the same when resumed.

    Pass 1's record i is pass 0's with other noise; a run resumed mid-pass 1 reads the batches the straight run read.
    """

    def jittered():
        return GrainPipeline(source, batch_size=16, transforms=[Jitter()], shuffle=False, worker_count=2)

    def collect(engine):
        seen = []
        engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(np.asarray(e.state.output["x"])))
        return seen

    straight = Engine(lambda e, batch: batch)
    everything = collect(straight)
    straight.run(jittered(), max_epochs=2)
    assert len(everything) == 8
    for first, second in zip(everything[:4], everything[4:], strict=True):  # the same records, another draw
        assert not np.allclose(first, second)
        np.testing.assert_allclose(first, second, atol=1.0)  # noise of 0.1 around the same examples

    stopped = Engine(lambda e, batch: batch)
    stopped.add_event_handler(Events.ITERATION_COMPLETED(once=6), lambda e: e.terminate(final=False))
    stopped.run(jittered(), max_epochs=2)
    resumed = Engine(lambda e, batch: batch)
    rest = collect(resumed)
    resumed.load_state_dict(stopped.state_dict())
    resumed.run(jittered())
    assert len(rest) == 2
    for got, want in zip(rest, everything[6:], strict=True):
        np.testing.assert_array_equal(got, want)
    assert children() == []
