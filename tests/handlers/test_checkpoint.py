import re
import threading
import time

import jax
import numpy as np
import optax
import pytest

import ember.checkpoint._msgpack as store_module
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
    saver = Checkpoint({"trainer": first}, tmp_path, n_saved=2)
    saver.attach(first, Events.ITERATION_COMPLETED(every=2))
    first.add_event_handler(Events.ITERATION_COMPLETED(once=stop_at), lambda e: e.terminate())
    first.run(data, max_epochs=3)
    assert [c.step for c in saver.store.checkpoints()] == [stop_at - 2, stop_at]

    second, fresh_data = new_trainer()
    info = load_objects({"trainer": second}, tmp_path)
    assert info.step == stop_at
    second.run(fresh_data)
    assert second.state.iteration == 12
    for a, b in zip(
        jax.tree.leaves(second.state.train_state), jax.tree.leaves(straight.state.train_state), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_loading_into_a_running_trainer_is_refused_before_its_arrays_are_touched(tmp_path):
    """load_objects from a handler of the run it would load into: one line naming it, and the run trains on."""
    straight, data = new_trainer()
    straight.run(data, max_epochs=2)
    trainer, data = new_trainer()
    saver = Checkpoint({"trainer": trainer}, tmp_path, background=False)
    saver.attach(trainer, Events.ITERATION_COMPLETED(once=2))
    refused = []

    def load_midway(engine):
        with pytest.raises(RuntimeError) as error:
            load_objects({"trainer": engine}, tmp_path)
        refused.append(str(error.value))

    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=3), load_midway)
    trainer.run(data, max_epochs=2)
    assert refused == [
        "load_objects: ['trainer'] is running; load a checkpoint before run() (or after it returns), not from one of "
        "its handlers."
    ]
    for a, b in zip(
        jax.tree.leaves(trainer.state.train_state), jax.tree.leaves(straight.state.train_state), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # nothing released: the run ended as straight


def test_ignites_checkpoint_on_an_evaluator_keeps_the_best_named_by_the_trainers_epoch(tmp_path):
    """Ignite's arguments, positionally: the n_saved best by score_function, named by the trainer's epoch."""
    trainer = Engine(lambda e, b: b)
    evaluator = Engine(lambda e, b: b)
    scores = iter([0.5, 0.9, 0.7, 0.6])
    saver = Checkpoint(
        {"trainer": trainer}, tmp_path, "mnist", lambda e: next(scores), "acc", 2, global_step_from_engine(trainer)
    )
    saver.attach(evaluator, Events.COMPLETED)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: evaluator.run([0]))
    trainer.run([1, 2], max_epochs=4)
    saver.store.wait()
    names = [c.path.name for c in saver.store.checkpoints()]
    assert names == ["mnist_step_00000002-acc=0.9000", "mnist_step_00000003-acc=0.7000"]
    assert saver.store.best("acc").step == 2


def test_a_step_function_of_ignites_shape_gets_the_event_and_names_before_ignites_are_refused(tmp_path):
    """global_step_transform(engine, event_name) as Ignite calls it; ember's unreleased names raise TypeError."""
    trainer = Engine(lambda e, b: b)
    seen = []
    saver = Checkpoint(
        {"trainer": trainer},
        tmp_path / "ignite",
        global_step_transform=lambda engine, event_name: seen.append(event_name) or engine.state.iteration * 10,
        background=False,
    )
    saver.attach(trainer, Events.ITERATION_COMPLETED(every=2))
    trainer.run([1, 2])
    assert seen == [Events.ITERATION_COMPLETED]
    assert [c.step for c in saver.store.checkpoints()] == [20]
    for old in ("store", "keep_latest", "keep_best", "score_fn", "step_fn", "prefix"):  # never released: gone
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'"):
            Checkpoint({"trainer": trainer}, tmp_path / "old", **{old: 1})


def test_load_objects_takes_one_checkpoints_folder_as_ignites_resume_from_passes_it(tmp_path):
    """load_objects(..., "<dir>/step_00000002") loads that checkpoint, not the folder's latest."""
    trainer = Engine(lambda e, b: b)
    Checkpoint({"trainer": trainer}, tmp_path, n_saved=None, background=False).attach(
        trainer, Events.ITERATION_COMPLETED
    )
    trainer.run([1, 2, 3])
    fresh = Engine(lambda e, b: b)
    assert load_objects({"trainer": fresh}, tmp_path / "step_00000002").step == 2
    assert fresh.state.iteration == 2
    assert load_objects({"trainer": fresh}, str(tmp_path)).step == 3


def test_n_saved_keeps_the_best_with_a_score_the_newest_without_and_none_keeps_all(tmp_path):
    """Ignite's n_saved: ranked by score_function when given, else by step; None deletes nothing."""
    scores = {2: 0.5, 4: 0.9, 6: 0.7, 8: 0.6}
    cases = [("best", 2, lambda e: scores[e.state.iteration]), ("newest", 2, None), ("all", None, None)]
    kept = {}
    for folder, n_saved, score in cases:
        trainer = Engine(lambda e, b: b)
        saver = Checkpoint(
            {"trainer": trainer}, tmp_path / folder, score_function=score, n_saved=n_saved, background=False
        )
        saver.attach(trainer, Events.ITERATION_COMPLETED(every=2))
        trainer.run(range(8))
        kept[folder] = [c.step for c in saver.store.checkpoints()]
    assert kept == {"best": [4, 6], "newest": [6, 8], "all": [2, 4, 6, 8]}


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
        while not saver.store._writer.pending.done():
            time.sleep(0.01)

    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=2), until_the_write_failed)
    with pytest.raises(OSError, match="No space left on device"):
        trainer.run(range(50))
    assert trainer.state.iteration == 3  # failed during iteration 2's handlers; raised at the next check


@pytest.mark.parametrize("event", [Events.ITERATION_COMPLETED(every=2), Events.COMPLETED])
def test_a_checkpoint_added_ignites_way_finishes_its_last_save_by_the_end_of_run(tmp_path, monkeypatch, event):
    """With add_event_handler (no attach), run() still returns with the save on disk, or raises its error."""
    trainer = Engine(lambda e, b: b)
    trainer.add_event_handler(event, Checkpoint({"trainer": trainer}, tmp_path / "ok", n_saved=None))
    trainer.run(range(4))
    assert [p.name for p in sorted((tmp_path / "ok").iterdir())] == (
        ["step_00000002", "step_00000004"] if event is not Events.COMPLETED else ["step_00000004"]
    )

    def disk_full(f, leaves):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_module, "write_leaves", disk_full)
    trainer = Engine(lambda e, b: b)
    trainer.add_event_handler(event, Checkpoint({"trainer": trainer}, tmp_path / "full"))
    with pytest.raises(OSError, match="No space left on device"):
        trainer.run(range(4))


def test_a_best_checkpoint_on_an_evaluator_run_from_the_trainer_is_finished_by_the_trainers_run(tmp_path, monkeypatch):
    """The evaluator's run returns while its save is written; the trainer's run returns with every save on disk."""
    release, order = threading.Event(), []
    real_write = store_module.write_leaves

    def held_write(f, leaves):
        assert release.wait(timeout=10), "the write was never released"  # no wait: the evaluator's run hung
        order.append("written")
        return real_write(f, leaves)

    monkeypatch.setattr(store_module, "write_leaves", held_write)
    trainer, evaluator = Engine(lambda e, b: b), Engine(lambda e, b: b)
    scores = iter([0.5, 0.9])
    saver = Checkpoint({"trainer": trainer}, tmp_path, score_function=lambda e: next(scores), score_name="acc")
    saver.attach(evaluator, Events.COMPLETED)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: (evaluator.run([0]), order.append("evaluated")))
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=3), lambda e: (order.append("released"), release.set()))
    trainer.run([1, 2], max_epochs=2)
    assert order[:2] == ["evaluated", "released"]  # the first save was held while the trainer went on
    assert order.count("written") == 2  # the trainer's COMPLETED waited for the last save
    assert not saver.store.writing
    assert [c.metrics for c in saver.store.checkpoints()] == [{"acc": 0.9}]  # the best one kept


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
    with pytest.raises(ValueError, match=r"`n_saved` must be a positive int or None \(keep every checkpoint\), got 0"):
        Checkpoint({"t": Engine(lambda e, b: b)}, tmp_path, n_saved=0)
    with pytest.raises(
        TypeError,
        match=re.escape(
            "`save_handler` must be a folder, a CheckpointStore, a DiskSaver, or a callable (checkpoint, filename, "
            "metadata) such as a BaseSaveHandler; got int."
        ),
    ):
        Checkpoint({"t": Engine(lambda e, b: b)}, 3)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match=r"No valid checkpoint in .* to load from"):
        load_objects({"t": Engine(lambda e, b: b)}, tmp_path / "empty")
    engine = Engine(lambda e, b: b)
    engine.run([1])
    Checkpoint({"a": engine}, tmp_path / "c", background=False)(engine)
    with pytest.raises(ValueError, match=r"holds no state for \['b'\]; it holds \['a'\]"):
        load_objects({"b": Engine(lambda e, b: b)}, CheckpointStore(tmp_path / "c"))


def test_keep_latest_none_keeps_every_checkpoint(tmp_path):
    trainer = Engine(lambda e, b: b)
    Checkpoint({"trainer": trainer}, tmp_path, n_saved=None).attach(trainer, Events.ITERATION_COMPLETED(every=2))
    trainer.run(range(6))
    assert [c.step for c in CheckpointStore(tmp_path).checkpoints()] == [2, 4, 6]


def test_firing_twice_at_one_step_saves_once(tmp_path):
    """EPOCH_COMPLETED | COMPLETED both fire after the last iteration: one checkpoint, no error."""
    trainer = Engine(lambda e, b: b)
    saver = Checkpoint({"trainer": trainer}, tmp_path, n_saved=None)
    saver.attach(trainer, Events.EPOCH_COMPLETED | Events.COMPLETED)
    trainer.run([1, 2], max_epochs=2)
    assert [c.step for c in saver.store.checkpoints()] == [2, 4]
    assert saver.save_now(trainer).step == 4  # still the one on disk


def _saved_trainer(folder, steps=(2, 4)):
    trainer = Engine(lambda e, b: b)
    saver = Checkpoint({"trainer": trainer}, folder, n_saved=None, background=False)
    saver.attach(trainer, Events.ITERATION_COMPLETED(every=2))
    trainer.run(range(max(steps)))
    return saver


class Weights:
    """An array tree that follows its engine's iteration (what a trainer's state is, to a checkpoint)."""

    def __init__(self, engine):
        self.engine, self.loaded = engine, None

    def tree_state_dict(self):
        return {"w": np.full(64, float(self.engine.state.iteration), np.float32)}

    def load_tree_state_dict(self, tree):
        self.loaded = tree


def test_resume_falls_back_past_a_checksum_corrupt_checkpoint_and_names_it(tmp_path):
    """A bit flip inside an array's bytes (the file still parses): the CRC-32 catches it; the previous one is used."""
    from ember.checkpoint._format import parse_leaves

    trainer = Engine(lambda e, b: b)
    saver = Checkpoint({"trainer": trainer, "weights": Weights(trainer)}, tmp_path, n_saved=None, background=False)
    saver.attach(trainer, Events.ITERATION_COMPLETED(every=2))
    trainer.run(range(4))
    data = tmp_path / "step_00000004" / "state.msgpack"
    raw = bytearray(data.read_bytes())
    raw[-5] ^= 0x01  # a byte of the last float32 of the array "w"
    data.write_bytes(bytes(raw))
    damaged = parse_leaves(np.frombuffer(bytes(raw), np.uint8))["weights/w"]
    assert damaged[:-2].tolist() == [4.0] * 62  # the damage does not break the file: only its checksum can tell
    fresh = Engine(lambda e, b: b)
    weights = Weights(fresh)
    with pytest.warns(UserWarning, match="does not match the checksum") as caught:
        info = Checkpoint({"trainer": fresh, "weights": weights}, tmp_path).resume()
    assert [str(w.message) for w in caught] == [
        f"Checkpoint '{tmp_path / 'step_00000004'}' is corrupt: its state.msgpack does not match the checksum in "
        "manifest.json. It was moved aside to 'corrupt-step_00000004' and skipped."
    ]
    assert (info.step, fresh.state.iteration) == (2, 2)
    assert weights.loaded["w"].tolist() == [2.0] * 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt-step_00000004", "step_00000002"]


def test_a_run_resumed_before_a_truncated_checkpoint_saves_that_step_again(tmp_path):
    """The truncated checkpoint is moved aside on resume; reaching its step later writes a good one."""
    _saved_trainer(tmp_path)
    data = tmp_path / "step_00000004" / "state.msgpack"
    data.write_bytes(data.read_bytes()[:-3])
    trainer = Engine(lambda e, b: b)
    saver = Checkpoint({"trainer": trainer}, tmp_path, n_saved=None, background=False)
    saver.attach(trainer, Events.ITERATION_COMPLETED(every=2))
    with pytest.warns(UserWarning, match=r"state.msgpack holds \d+ bytes, the manifest says \d+ \(truncated\)"):
        saver.resume()
    trainer.run(range(4))
    assert [c.path.name for c in saver.store.checkpoints()] == ["step_00000002", "step_00000004"]
    assert (tmp_path / "corrupt-step_00000004").is_dir()


def test_a_second_save_of_one_step_with_other_state_dicts_rewrites_only_its_manifest(tmp_path, monkeypatch):
    """Saved again at one step with only a state dict changed: the manifest is rewritten; no array is written again."""
    writes = []
    real = store_module.write_leaves
    monkeypatch.setattr(store_module, "write_leaves", lambda f, leaves: writes.append(f.name) or real(f, leaves))
    trainer = Engine(lambda e, b: b)
    trainer.state_dict_user_keys.append("note")
    trainer.state.note = "first"
    saver = Checkpoint({"trainer": trainer}, tmp_path, n_saved=None, background=False)
    saver.attach(trainer, Events.EPOCH_COMPLETED | Events.COMPLETED)
    trainer.run([1, 2])
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000002"]
    trainer.state.note = "second"
    saver(trainer)
    assert [c.path.name for c in saver.store.checkpoints()] == ["step_00000002"]
    assert saver.store.latest().manifest["metadata"]["state_dicts"]["trainer"]["note"] == "second"
    assert len(writes) == 1


def final_save_run(tmp_path, background):
    """The docs' checkpoint events on a run that ends on a multiple of N at an epoch's end (issue: written twice)."""
    trainer, data = new_trainer()  # 4 iterations an epoch
    saver = Checkpoint({"trainer": trainer}, tmp_path, n_saved=2, background=background)
    saver.attach(trainer, Events.ITERATION_COMPLETED(every=4) | Events.COMPLETED)
    return trainer, data, saver


@pytest.mark.parametrize("background", [True, False], ids=["background", "foreground"])
def test_the_final_state_is_written_once_and_the_previous_resume_point_is_kept(tmp_path, monkeypatch, background):
    """ITERATION_COMPLETED(every=4) | COMPLETED ending at iteration 8: step 8 written once, step 4 kept."""
    writes = []
    real = store_module.write_leaves
    monkeypatch.setattr(store_module, "write_leaves", lambda f, leaves: writes.append(f.name) or real(f, leaves))
    trainer, data, saver = final_save_run(tmp_path, background)
    trainer.run(data, max_epochs=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004", "step_00000008"]
    assert len(writes) == 2  # step 4 and step 8, each once
    final = saver.store.latest().manifest["metadata"]["state_dicts"]["trainer"]
    assert final["iteration"] == 8
    assert "epoch_completed" not in final  # the amended state: the epoch did complete


def test_a_changed_state_at_a_saved_step_replaces_that_checkpoint(tmp_path):
    """Arrays changed after a save at the same step (a handler set new values): one checkpoint, holding the new ones."""
    trainer, data = new_trainer()
    saver = Checkpoint({"trainer": trainer}, tmp_path, n_saved=2, background=True)
    saver.attach(trainer, Events.ITERATION_COMPLETED(every=4) | Events.COMPLETED)
    lowered = []

    def lower_the_weights(engine):  # at EPOCH_COMPLETED, between the iteration's save and COMPLETED's
        engine.state.train_state = jax.tree.map(
            lambda x: x * 0.5 if x.dtype == np.float32 else x, engine.state.train_state
        )
        lowered.append(np.asarray(engine.state.train_state.params["Dense_0"]["kernel"]))

    trainer.add_event_handler(Events.EPOCH_COMPLETED(once=2), lower_the_weights)
    trainer.run(data, max_epochs=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004", "step_00000008"]
    tree, _ = saver.store.restore()
    np.testing.assert_array_equal(tree["trainer"]["params.Dense_0.kernel"], lowered[0])


def test_a_resumed_run_amends_the_checkpoint_it_resumed_from_for_the_epoch_end_it_owed(tmp_path, monkeypatch):
    """Stopped right after the save at an epoch's last iteration: the relaunch's EPOCH_COMPLETED amends it."""
    first, data = new_trainer()
    saver = Checkpoint({"trainer": first}, tmp_path, n_saved=2)
    saver.attach(first, Events.ITERATION_COMPLETED(every=4) | Events.EPOCH_COMPLETED)
    first.add_event_handler(Events.ITERATION_COMPLETED(once=4), lambda e: e.terminate())
    first.run(data, max_epochs=2)
    assert saver.store.latest().manifest["metadata"]["state_dicts"]["trainer"]["epoch_completed"] is False

    writes = []
    real = store_module.write_leaves
    monkeypatch.setattr(store_module, "write_leaves", lambda f, leaves: writes.append(f.name) or real(f, leaves))
    second, data = new_trainer()
    again = Checkpoint({"trainer": second}, tmp_path, n_saved=2)
    again.attach(second, Events.ITERATION_COMPLETED(every=4) | Events.EPOCH_COMPLETED)
    assert again.resume().step == 4
    second.add_event_handler(Events.EPOCH_COMPLETED, lambda e: e.terminate())  # the epoch owed, then stop
    second.run(data, max_epochs=2)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000004"]
    assert writes == []  # the arrays were not written again
    assert "epoch_completed" not in again.store.latest().manifest["metadata"]["state_dicts"]["trainer"]


def test_ignites_disk_saver_and_model_checkpoint(tmp_path):
    """DiskSaver refuses a used folder unless told; ModelCheckpoint saves what it is handed, as Ignite's mnist.py."""
    from ember.handlers import DiskSaver, ModelCheckpoint

    trainer = Engine(lambda e, b: b)
    scores = iter([0.2, 0.9, 0.5])
    handler = ModelCheckpoint(tmp_path, "mnist", score_function=lambda e: next(scores), score_name="acc", n_saved=2)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, handler, {"trainer": trainer})
    trainer.run([1, 2], max_epochs=3)
    assert [c.path.name for c in handler.store.checkpoints()] == [
        "mnist_step_00000004-acc=0.9000",
        "mnist_step_00000006-acc=0.5000",
    ]
    fresh = Engine(lambda e, b: b)
    assert Checkpoint.load_objects({"trainer": fresh}, tmp_path / "mnist_step_00000004-acc=0.9000").step == 4
    with pytest.raises(ValueError, match=r"already holds checkpoints \(mnist_step_00000004-acc=0.9000, "):
        DiskSaver(tmp_path)
    assert DiskSaver(tmp_path, require_empty=False).store.root == tmp_path
    with pytest.raises(ValueError, match=re.escape("`atomic` must be True: ember writes every checkpoint atomically")):
        DiskSaver(tmp_path / "new", atomic=False)
    with pytest.raises(ValueError, match=r"does not exist, and create_dir=False"):
        DiskSaver(tmp_path / "missing", create_dir=False)
    with pytest.raises(TypeError, match=r"ModelCheckpoint saves what it is given: add it with"):
        ModelCheckpoint(tmp_path / "other")(trainer)


class CountedState:
    """A stateful object that counts how often a checkpoint collects its state."""

    def __init__(self):
        self.collected = 0

    def state_dict(self):
        self.collected += 1
        return {"collected": self.collected}

    def load_state_dict(self, state):
        self.collected = state["collected"]


def test_a_best_checkpoint_that_does_not_improve_collects_nothing(tmp_path):
    """Retention decides first: only the admitted saves (scores 0.5, 0.6, 0.7 of 0.5, 0.4, 0.6, 0.6, 0.7) collect."""
    scores = iter([0.5, 0.4, 0.6, 0.6, 0.7])
    engine, counted = Engine(lambda e, b: b), CountedState()
    saver = Checkpoint({"counted": counted}, tmp_path, n_saved=1, score_function=lambda e: next(scores))
    saver.attach(engine, Events.EPOCH_COMPLETED)
    engine.run([0], max_epochs=5)
    saver.wait()
    assert counted.collected == 3
    assert [(c.step, c.manifest["metadata"]["state_dicts"]["counted"]) for c in saver.store.checkpoints()] == [
        (5, {"collected": 3})
    ]


def test_a_checkpoint_handlers_keep_every_pins_its_multiples_beside_the_newest(tmp_path):
    """n_saved=2, keep_every=4, a save each iteration for 10: the multiples of 4 stay, with the newest two."""
    engine = Engine(lambda e, b: b)
    saver = Checkpoint({"trainer": engine}, tmp_path, n_saved=2, keep_every=4)
    saver.attach(engine, Events.ITERATION_COMPLETED)
    engine.run(range(10))
    saver.store.close()
    names = ["step_00000004", "step_00000008", "step_00000009", "step_00000010"]
    assert [c.path.name for c in saver.store.checkpoints()] == names
    assert saver.state_dict() == {"_saved": [(4, names[0]), (8, names[1]), (9, names[2]), (10, names[3])]}


def test_keep_while_holds_a_checkpoint_past_n_saved_until_it_says_otherwise_then_the_next_save_removes_it(tmp_path):
    """n_saved=1, a save each iteration; a reader takes steps 1..3 only at iteration 6: they stay until then."""
    engine, read = Engine(lambda e, b: b), [0]
    saver = Checkpoint({"trainer": engine}, tmp_path, n_saved=1, keep_while=lambda step: 1 <= step <= 3 and read[0] < 3)
    saver.attach(engine, Events.ITERATION_COMPLETED)
    on_disk = []
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda: on_disk.append(saver.wait() and kept(saver)))
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=5), lambda: read.__setitem__(0, 3))
    engine.run(range(7))
    saver.store.close()
    assert on_disk == [[1], [1, 2], [1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 5], [6], [7]]
    assert saver.state_dict() == {"_saved": [(7, "step_00000007")]}
    with pytest.raises(TypeError, match=re.escape("`keep_while` must be callable as keep_while(step) -> bool, got 3.")):
        Checkpoint({"trainer": engine}, tmp_path, keep_while=3)  # type: ignore[arg-type]


def kept(saver):
    return [c.step for c in saver.store.checkpoints()]


@pytest.mark.parametrize("where", ["store", "save handler"])
def test_a_save_listener_hears_only_the_checkpoints_written(tmp_path, where):
    """n_saved=1 by score: the second, worse score is not admitted, so no listener call for it."""
    scores = iter([0.5, 0.3, 0.9])
    engine = Engine(lambda e, b: b)
    written = []
    handler = tmp_path if where == "store" else (lambda checkpoint, filename, metadata=None: written.append(filename))
    saver = Checkpoint({"trainer": engine}, handler, n_saved=1, score_function=lambda e: next(scores))
    heard = []
    saver.add_save_listener(heard.append)
    saver.attach(engine, Events.ITERATION_COMPLETED)
    engine.run(range(3))
    if saver.store is not None:
        saver.store.close()
    assert heard == [1, 3]
    assert len(written) == (0 if where == "store" else 2)
