import re
import threading
import time

import jax
import numpy as np
import optax
import pytest

import ember.checkpoint._store as store_module
from ember import Engine, Events
from ember.checkpoint import CheckpointStore
from ember.data import ArrayDataset
from ember.handlers import Checkpoint, global_step_from_engine, load_objects
from ember.training import TrainState, create_evaluator, create_trainer
from tests.training.models import LinenNet, batches, classification_loss

ARRAYS = {"x": np.concatenate([b["x"] for b in batches(4)]), "y": np.concatenate([b["y"] for b in batches(4)])}


def new_trainer():
    state = TrainState.from_linen(LinenNet(), ARRAYS["x"][:2], optax.adam(1e-2), seed=0, rngs=("dropout",))
    return create_trainer(state, classification_loss), ArrayDataset(ARRAYS, batch_size=16, shuffle=True, seed=3)


@pytest.mark.parametrize("stop_at", [6, 8])  # mid-epoch, and at an epoch boundary
def test_saving_and_loading_resumes_exactly(tmp_path, stop_at):
    """Train, checkpoint every 2 steps, stop; load into a new trainer and finish: params equal a straight run."""
    straight, data = new_trainer()
    straight.run(data, max_epochs=3)

    first, data = new_trainer()
    saver = Checkpoint({"trainer": first, "data": data}, tmp_path, keep_latest=2)
    saver.attach(first, Events.ITERATION_COMPLETED(every=2))
    first.add_event_handler(Events.ITERATION_COMPLETED(once=stop_at), lambda e: e.terminate())
    first.run(data, max_epochs=3)
    assert [c.step for c in saver.store.checkpoints()] == [stop_at - 2, stop_at]

    second, fresh_data = new_trainer()
    info = load_objects({"trainer": second, "data": fresh_data}, tmp_path)
    assert info.step == stop_at
    second.run(fresh_data)
    assert second.state.iteration == 12
    for a, b in zip(
        jax.tree.leaves(second.state.train_state), jax.tree.leaves(straight.state.train_state), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_best_and_latest_are_kept_together_with_scores_in_names(tmp_path):
    """On an evaluator with a score and the trainer's step, the best and the latest both survive."""
    trainer = Engine(lambda e, b: b)
    evaluator = Engine(lambda e, b: b)
    scores = iter([0.5, 0.9, 0.7, 0.6])
    saver = Checkpoint(
        {"trainer": trainer},
        tmp_path,
        keep_latest=1,
        keep_best=1,
        score_fn=lambda e: next(scores),
        score_name="acc",
        step_fn=global_step_from_engine(trainer),
    )
    saver.attach(evaluator, Events.COMPLETED)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: evaluator.run([0]))
    trainer.run([1, 2], max_epochs=4)
    saver.store.wait()
    assert [c.path.name for c in saver.store.checkpoints()] == ["step_00000004-acc=0.9000", "step_00000008-acc=0.6000"]
    assert saver.store.best("acc").step == 4


def test_a_failed_background_write_stops_the_run(tmp_path, monkeypatch):
    """A write error in the background is raised at the next iteration, out of run()."""
    released = threading.Event()

    def disk_full(f, leaves):
        released.wait(timeout=60)  # fails only once the test lets it: the same on a busy machine
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_module, "write_leaves", disk_full)
    trainer = Engine(lambda e, b: b)
    saver = Checkpoint({"trainer": trainer}, tmp_path)
    saver.attach(trainer, Events.ITERATION_COMPLETED(once=1))

    def until_the_write_failed() -> None:  # after iteration 2's check: the error surfaces at iteration 3's
        released.set()
        while not saver.store._pending.done():
            time.sleep(0.01)

    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=2), until_the_write_failed)
    with pytest.raises(OSError, match="No space left on device"):
        trainer.run(range(50))
    assert trainer.state.iteration == 3  # failed during iteration 2's handlers; raised at the next check


def test_evaluator_state_is_not_a_tree(tmp_path):
    """An evaluator built on a trainer has no train state of its own to save until it has one."""
    trainer, _ = new_trainer()
    evaluator = create_evaluator(trainer, lambda model, b: model(b["x"]))
    with pytest.raises(RuntimeError, match=r"has no train state yet"):
        Checkpoint({"evaluator": evaluator}, tmp_path, background=False)(evaluator)


def test_checkpoint_and_load_objects_errors(tmp_path):
    """Bad to_save entries and policies, missing state and an empty store fail clearly."""
    with pytest.raises(TypeError, match=r"`to_save\['model'\]` must have state_dict\(\)/load_state_dict\(\)"):
        Checkpoint({"model": object()}, tmp_path)
    with pytest.raises(ValueError, match=r"`keep_best` needs `score_fn`"):
        Checkpoint({"t": Engine(lambda e, b: b)}, tmp_path, keep_best=2)
    with pytest.raises(ValueError, match=r"`keep_latest` must be a positive int or None, got 0"):
        Checkpoint({"t": Engine(lambda e, b: b)}, tmp_path, keep_latest=0)
    with pytest.raises(FileNotFoundError, match=r"No valid checkpoint in .* to load from"):
        load_objects({"t": Engine(lambda e, b: b)}, tmp_path / "empty")
    engine = Engine(lambda e, b: b)
    engine.run([1])
    Checkpoint({"a": engine}, tmp_path / "c", background=False)(engine)
    with pytest.raises(KeyError, match=r"holds no state for \['b'\]; it holds \['a'\]"):
        load_objects({"b": Engine(lambda e, b: b)}, CheckpointStore(tmp_path / "c"))


def test_keep_latest_none_keeps_every_checkpoint(tmp_path):
    trainer = Engine(lambda e, b: b)
    Checkpoint({"trainer": trainer}, tmp_path, keep_latest=None).attach(trainer, Events.ITERATION_COMPLETED(every=2))
    trainer.run(range(6))
    assert [c.step for c in CheckpointStore(tmp_path).checkpoints()] == [2, 4, 6]


def test_firing_twice_at_one_step_saves_once(tmp_path):
    """EPOCH_COMPLETED | COMPLETED both fire after the last iteration: one checkpoint, no error."""
    trainer = Engine(lambda e, b: b)
    saver = Checkpoint({"trainer": trainer}, tmp_path, keep_latest=None)
    saver.attach(trainer, Events.EPOCH_COMPLETED | Events.COMPLETED)
    trainer.run([1, 2], max_epochs=2)
    assert [c.step for c in saver.store.checkpoints()] == [2, 4]
    assert saver.save_now(trainer).step == 4  # still the one on disk


def _saved_trainer(folder, steps=(2, 4)):
    trainer = Engine(lambda e, b: b)
    saver = Checkpoint({"trainer": trainer}, folder, keep_latest=None, background=False)
    saver.attach(trainer, Events.ITERATION_COMPLETED(every=2))
    trainer.run(range(max(steps)))
    return saver


def test_resume_falls_back_past_a_checksum_corrupt_checkpoint_and_names_it(tmp_path):
    """A bit flip in the newest data file: resume() warns naming folder and file, moves it aside, uses the previous."""
    _saved_trainer(tmp_path)
    data = tmp_path / "step_00000004" / "state.msgpack"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0x01
    data.write_bytes(bytes(raw))
    fresh = Engine(lambda e, b: b)
    with pytest.warns(
        UserWarning,
        match=re.escape(f"Checkpoint '{tmp_path / 'step_00000004'}' is corrupt: its state.msgpack ")
        + ".* It was moved aside to 'corrupt-step_00000004' and skipped.",
    ):
        info = Checkpoint({"trainer": fresh}, tmp_path).resume()
    assert (info.step, fresh.state.iteration) == (2, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt-step_00000004", "step_00000002"]


def test_a_run_resumed_before_a_truncated_checkpoint_saves_that_step_again(tmp_path):
    """The truncated checkpoint is moved aside on resume; reaching its step later writes a good one."""
    _saved_trainer(tmp_path)
    data = tmp_path / "step_00000004" / "state.msgpack"
    data.write_bytes(data.read_bytes()[:-3])
    trainer = Engine(lambda e, b: b)
    saver = Checkpoint({"trainer": trainer}, tmp_path, keep_latest=None, background=False)
    saver.attach(trainer, Events.ITERATION_COMPLETED(every=2))
    with pytest.warns(UserWarning, match=r"state.msgpack holds \d+ bytes, the manifest says \d+ \(truncated\)"):
        saver.resume()
    trainer.run(range(4))
    assert [c.path.name for c in saver.store.checkpoints()] == ["step_00000002", "step_00000004"]
    assert (tmp_path / "corrupt-step_00000004").is_dir()


def test_a_second_save_of_one_step_is_skipped_if_unchanged_and_kept_beside_it_if_changed(tmp_path):
    """EPOCH_COMPLETED | COMPLETED saves once; a changed state at the same step goes to <name>.2, the newest."""
    trainer = Engine(lambda e, b: b)
    trainer.state_dict_user_keys.append("note")
    trainer.state.note = "first"
    saver = Checkpoint({"trainer": trainer}, tmp_path, keep_latest=None, background=False)
    saver.attach(trainer, Events.EPOCH_COMPLETED | Events.COMPLETED)
    trainer.run([1, 2])
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000002"]
    trainer.state.note = "second"
    saver(trainer)
    assert [c.path.name for c in saver.store.checkpoints()] == ["step_00000002", "step_00000002.2"]
    assert saver.store.latest().manifest["metadata"]["state_dicts"]["trainer"]["note"] == "second"
