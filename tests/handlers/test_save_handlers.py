"""Checkpoint as Ignite users write it: their own save handlers, Ignite's keep rule, names, and in-memory loading.

Expected calls, names and kept sets follow Ignite 0.5.5's ``Checkpoint.__call__`` (``ignite/handlers/checkpoint.py``),
except the order of ``remove`` and the save (ember saves first; the guide lists it).
"""

import re

import jax
import numpy as np
import optax
import pytest

import ember.checkpoint._msgpack as store_module
from ember import Engine, Events
from ember.data import ArrayDataset
from ember.handlers import BaseSaveHandler, Checkpoint, SaveHandler, global_step_from_engine
from ember.training import TrainState, create_trainer
from tests.slow_writes import held_checkpoint_writes
from tests.training.models import LinenNet, batches, classification_loss


class Recorder(BaseSaveHandler):
    """A save handler in memory that records every call, as a mock in a user's test does."""

    def __init__(self) -> None:
        self.files: dict[str, object] = {}
        self.calls: list[tuple[str, str]] = []
        self.metadata: list[object] = []

    def __call__(self, checkpoint, filename, metadata=None):
        self.calls.append(("save", filename))
        self.files[filename] = checkpoint
        self.metadata.append(metadata)

    def remove(self, filename):
        self.calls.append(("remove", filename))
        del self.files[filename]


def scored_run(saver_args: dict, scores: list[float], **kwargs) -> Recorder:
    """An evaluator scored ``scores`` once per trainer epoch, a Checkpoint of both engines on its COMPLETED."""
    trainer, evaluator, recorder = Engine(lambda e, b: b), Engine(lambda e, b: b), Recorder()
    it = iter(scores)
    evaluator.add_event_handler(Events.COMPLETED, lambda e: e.state.metrics.update(acc=next(it)))
    saver = Checkpoint({"trainer": trainer, "evaluator": evaluator}, recorder, **saver_args, **kwargs)
    evaluator.add_event_handler(Events.COMPLETED, saver)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: evaluator.run([0]))
    trainer.run([1, 2], max_epochs=len(scores))
    return recorder


def test_a_base_save_handler_gets_ignites_calls_names_metadata_and_dict():
    trainer, recorder = Engine(lambda e, b: b), Recorder()
    saver = Checkpoint({"trainer": trainer}, recorder, n_saved=2)
    trainer.add_event_handler(Events.ITERATION_COMPLETED, saver)
    trainer.run(range(4))
    assert recorder.calls == [
        ("save", "trainer_1.ckpt"),
        ("save", "trainer_2.ckpt"),
        ("save", "trainer_3.ckpt"),
        ("remove", "trainer_1.ckpt"),
        ("save", "trainer_4.ckpt"),
        ("remove", "trainer_2.ckpt"),
    ]
    assert recorder.metadata[-1] == {"basename": "trainer", "score_name": None, "priority": 4}
    assert recorder.files == {  # one object: its state dict as it is (Ignite's)
        "trainer_3.ckpt": {"epoch_length": 4, "iteration": 3, "max_epochs": 1},
        "trainer_4.ckpt": {"epoch_completed": False, "epoch_length": 4, "iteration": 4, "max_epochs": 1},
    }  # at the epoch's last iteration, before its EPOCH_COMPLETED: ember's state dict says so
    assert (saver.last_checkpoint, saver.save_handler, saver.store) == ("trainer_4.ckpt", recorder, None)
    assert saver.state_dict() == {"_saved": [(3, "trainer_3.ckpt"), (4, "trainer_4.ckpt")]}  # Ignite's, exactly
    assert isinstance(recorder, SaveHandler)


def test_a_score_name_alone_scores_by_that_metric_and_names_files_as_ignite():
    recorder = scored_run({"filename_prefix": "best", "score_name": "acc", "n_saved": 2}, [0.5, 0.9, 0.7, 0.6])
    assert recorder.calls == [
        ("save", "best_checkpoint_acc=0.5000.ckpt"),
        ("save", "best_checkpoint_acc=0.9000.ckpt"),
        ("save", "best_checkpoint_acc=0.7000.ckpt"),
        ("remove", "best_checkpoint_acc=0.5000.ckpt"),
    ]
    assert recorder.metadata[0] == {"basename": "best_checkpoint", "score_name": "acc", "priority": 0.5}
    assert sorted(recorder.files["best_checkpoint_acc=0.9000.ckpt"]) == ["evaluator", "trainer"]


def test_a_global_step_transform_puts_the_step_in_the_name():
    trainer, evaluator, recorder = Engine(lambda e, b: b), Engine(lambda e, b: b), Recorder()
    saver = Checkpoint(
        {"model": trainer}, recorder, "best", score_function=lambda e: 0.25, score_name="acc", n_saved=None,
        global_step_transform=global_step_from_engine(trainer),
    )  # fmt: skip
    evaluator.add_event_handler(Events.COMPLETED, saver)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: evaluator.run([0]))
    trainer.run([1, 2], max_epochs=2)
    assert recorder.calls == [("save", "best_model_1_acc=0.2500.ckpt"), ("save", "best_model_2_acc=0.2500.ckpt")]


@pytest.mark.parametrize(
    ("greater_or_equal", "calls"),
    [
        (False, [("save", "checkpoint_acc=0.5000.ckpt")]),  # a tie is not saved: the first stays
        (True, [("save", "checkpoint_acc=0.5000.ckpt"), ("save", "checkpoint_acc=0.5000.ckpt")]),
    ],
)
def test_greater_or_equal_decides_a_tie_with_the_lowest_kept(greater_or_equal, calls):
    recorder = scored_run({"score_name": "acc"}, [0.5, 0.5], greater_or_equal=greater_or_equal)
    assert recorder.calls == calls  # the same name: saved over, not removed


def test_ties_among_the_kept_go_oldest_first_as_ignites_sorted_list():
    """Kept [0.5 (epoch 1), 0.5 (epoch 2)]; 0.7 pushes out epoch 1's, the lowest and oldest."""
    step = {"global_step_transform": lambda e, _: e.state.iteration, "score_name": "acc", "n_saved": 2}
    trainer, recorder = Engine(lambda e, b: b), Recorder()
    scores = iter([0.5, 0.5, 0.7])
    saver = Checkpoint({"trainer": trainer}, recorder, score_function=lambda e: next(scores), **step)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, saver)
    trainer.run([1], max_epochs=3)
    assert recorder.calls[-1] == ("remove", "trainer_1_acc=0.5000.ckpt")
    assert saver.last_checkpoint == "trainer_3_acc=0.7000.ckpt"


def test_plain_functions_of_two_or_three_arguments_are_save_handlers():
    trainer, two, three = Engine(lambda e, b: b), [], []
    trainer.add_event_handler(Events.COMPLETED, Checkpoint({"t": trainer}, lambda c, f: two.append(f)))
    trainer.add_event_handler(Events.COMPLETED, Checkpoint({"t": trainer}, lambda c, f, m: three.append((f, m))))
    trainer.run([1, 2])
    assert two == ["t_2.ckpt"]
    assert three == [("t_2.ckpt", {"basename": "t", "score_name": None, "priority": 2})]
    with pytest.raises(TypeError, match=r"`save_handler` must take \(checkpoint, filename, metadata\) or "):
        Checkpoint({"t": trainer}, lambda checkpoint: None)


def test_a_filename_pattern_names_checkpoints_and_an_unknown_field_is_named():
    recorder = scored_run({"score_name": "acc", "filename_pattern": "{global_step}-{name}-{score}.pt"}, [0.5])
    assert recorder.calls == [("save", "None-checkpoint-0.5000.pt")]  # no step asked for: Ignite renders None
    with pytest.raises(ValueError, match=re.escape("uses the field 'epoch'; it may use ext, filename_prefix, global")):
        scored_run({"score_name": "acc", "filename_pattern": "{epoch}.pt"}, [0.5])
    assert Checkpoint.setup_filename_pattern() == "{filename_prefix}_{name}_{global_step}_{score_name}={score}.{ext}"
    assert (
        Checkpoint.setup_filename_pattern(True, True, False, True)
        == "{filename_prefix}_{name}_{global_step}_{score}.{ext}"
    )
    with pytest.raises(ValueError, match=r"At least one of `with_score` and `with_global_step` must be True"):
        Checkpoint.setup_filename_pattern(with_score=False, with_global_step=False)
    with pytest.raises(ValueError, match=r"`with_score_name=True` needs `with_score=True`"):
        Checkpoint.setup_filename_pattern(with_score=False)


def test_include_self_saves_what_the_handler_keeps_and_it_loads_back():
    trainer, recorder = Engine(lambda e, b: b), Recorder()
    to_save = {"trainer": trainer}
    saver = Checkpoint(to_save, recorder, n_saved=2, include_self=True)
    trainer.add_event_handler(Events.ITERATION_COMPLETED, saver)
    trainer.run(range(3))
    saved = recorder.files["trainer_3.ckpt"]
    assert saved["checkpointer"] == {"_saved": [(2, "trainer_2.ckpt"), (3, "trainer_3.ckpt")]}
    again = Checkpoint({"trainer": Engine(lambda e, b: b)}, Recorder(), n_saved=2)
    Checkpoint.load_objects({"checkpointer": again}, {"checkpointer": saved["checkpointer"]})
    assert again.last_checkpoint == "trainer_3.ckpt"
    with pytest.raises(ValueError, match=r"`to_save` has the key 'checkpointer'"):
        Checkpoint({"checkpointer": trainer}, recorder, include_self=True)
    with pytest.raises(TypeError, match=r"`include_self=True` needs `to_save` to be mutable"):
        Checkpoint(_ReadOnly(to_save), recorder, include_self=True)


class _ReadOnly:
    """A mapping that is not a MutableMapping."""

    def __init__(self, d):
        self._d = d

    def __getitem__(self, k):
        return self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)

    def keys(self):
        return self._d.keys()

    def items(self):
        return self._d.items()

    def __contains__(self, k):
        return k in self._d


import collections.abc  # noqa: E402

collections.abc.Mapping.register(_ReadOnly)


def new_trainer(seed: int):
    x = np.concatenate([b["x"] for b in batches(4)])
    y = np.concatenate([b["y"] for b in batches(4)])
    state = TrainState.from_linen(LinenNet(), x[:2], optax.adam(1e-2), seed=seed, rngs=("dropout",))
    return create_trainer(state, classification_loss), ArrayDataset({"x": x, "y": y}, batch_size=16, shuffle=True)


def test_a_trainer_saved_through_a_save_handler_loads_back_exactly_from_the_dict():
    """The dict a save handler kept (host arrays) restores a fresh trainer: same arrays, same counters, same run."""
    trainer, data = new_trainer(seed=0)
    recorder = Recorder()
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=5), Checkpoint({"trainer": trainer}, recorder))
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=5), lambda e: e.terminate())
    trainer.run(data, max_epochs=2)
    saved = recorder.files["trainer_5.ckpt"]
    assert sorted(saved) == ["state_dict", "tree_state_dict"]
    assert all(isinstance(v, np.ndarray) for v in saved["tree_state_dict"].values())
    fresh, fresh_data = new_trainer(seed=1)
    fresh.build_state(next(iter(fresh_data)))
    assert Checkpoint.load_objects({"trainer": fresh}, saved) is None
    assert (fresh.state.iteration, fresh.state.epoch) == (5, 2)
    for a, b in zip(jax.tree.leaves(fresh.state.train_state), jax.tree.leaves(trainer.state.train_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    fresh.run(fresh_data)
    trainer.run(data)
    for a, b in zip(jax.tree.leaves(fresh.state.train_state), jax.tree.leaves(trainer.state.train_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    wrong = {**saved, "tree_state_dict": {**saved["tree_state_dict"], "step": np.zeros(3)}}
    with pytest.raises(ValueError, match=r"`checkpoint\['trainer'\]\['tree_state_dict'\]` does not fit trainer: step"):
        Checkpoint.load_objects({"trainer": fresh}, wrong)
    with pytest.raises(ValueError, match=r"`checkpoint\['trainer'\]` must hold \['tree_state_dict', 'state_dict'\]"):
        Checkpoint.load_objects({"trainer": fresh, "other": Engine(lambda e, b: b)}, {"trainer": {}, "other": {}})


def test_reset_forgets_what_was_kept_so_a_second_run_removes_none_of_it():
    trainer, recorder = Engine(lambda e, b: b), Recorder()
    saver = Checkpoint({"trainer": trainer}, recorder)
    trainer.add_event_handler(Events.COMPLETED, saver)
    trainer.add_event_handler(Events.STARTED, saver.reset)
    trainer.run([1, 2])
    trainer.run([1, 2, 3])
    assert recorder.calls == [("save", "trainer_2.ckpt"), ("save", "trainer_3.ckpt")]
    assert saver.last_checkpoint == "trainer_3.ckpt"


def test_a_failing_save_handler_keeps_what_was_kept():
    trainer, recorder = Engine(lambda e, b: b), Recorder()
    full = iter([False, True, False])

    def flaky(checkpoint, filename, metadata):
        if next(full):
            raise OSError(28, "No space left on device")
        recorder(checkpoint, filename, metadata)

    saver = Checkpoint({"trainer": trainer}, flaky, on_error="warn")
    trainer.add_event_handler(Events.ITERATION_COMPLETED, saver)
    with pytest.warns(RuntimeWarning, match=r"A checkpoint could not be written \(OSError: \[Errno 28\]"):
        trainer.run(range(3))
    assert [f for _, f in recorder.calls] == ["trainer_1.ckpt", "trainer_3.ckpt"]
    assert saver.state_dict()["_saved"] == [(3, "trainer_3.ckpt")]  # a plain function removes nothing


def test_last_checkpoint_names_a_background_save_as_soon_as_it_is_scheduled(tmp_path, monkeypatch):
    release = held_checkpoint_writes(monkeypatch)
    trainer = Engine(lambda e, b: b)
    saver = Checkpoint({"trainer": trainer}, tmp_path)
    saver.attach(trainer, Events.ITERATION_COMPLETED(once=2))
    seen = []

    def right_after(engine):
        seen.append((saver.last_checkpoint, saver.last_checkpoint.exists()))
        release.set()
        seen.append((saver.wait().path, saver.last_checkpoint.exists()))

    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=2), right_after)
    trainer.run(range(3))
    assert seen == [(tmp_path / "step_00000002", False), (tmp_path / "step_00000002", True)]


def test_into_a_store_a_checkpoint_retention_would_not_keep_is_never_written(tmp_path, monkeypatch):
    written = []
    real_write = store_module.write_leaves
    monkeypatch.setattr(store_module, "write_leaves", lambda f, leaves: (written.append(1), real_write(f, leaves))[1])
    trainer, evaluator = Engine(lambda e, b: b), Engine(lambda e, b: b)
    scores = iter([0.5, 0.9, 0.7, 0.6, 0.7])
    saver = Checkpoint(
        {"trainer": trainer}, tmp_path, score_function=lambda e: next(scores), score_name="acc", n_saved=2,
        global_step_transform=global_step_from_engine(trainer),
    )  # fmt: skip
    saver.attach(evaluator, Events.COMPLETED)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: evaluator.run([0]))
    trainer.run([1], max_epochs=5)
    assert len(written) == 3  # 0.5, 0.9, 0.7; not 0.6, nor 0.7 again (a tie with the lowest: greater_or_equal=False)
    assert [c.path.name for c in saver.store.checkpoints()] == ["step_00000002-acc=0.9000", "step_00000003-acc=0.7000"]
    assert saver.last_checkpoint == tmp_path / "step_00000002-acc=0.9000"


def test_a_relaunch_takes_over_the_checkpoints_left_in_the_folder(tmp_path):
    """A second handler on the folder, as after a relaunch: its first saves push out what the first one left."""
    first = Engine(lambda e, b: b)
    Checkpoint({"trainer": first}, tmp_path, "latest", n_saved=None, background=False).attach(
        first, Events.ITERATION_COMPLETED
    )
    first.add_event_handler(Events.ITERATION_COMPLETED(once=4), lambda e: e.terminate(final=False))
    first.run(range(6))
    other = Checkpoint({"trainer": first}, tmp_path, "best", background=False)
    other(first)  # another handler's checkpoint: not the relaunched one's to remove
    names = sorted(c.path.name for c in other.store.checkpoints())
    assert names == ["best_step_00000004", *(f"latest_step_{i:08d}" for i in range(1, 5))]
    second = Engine(lambda e, b: b)
    second.load_state_dict(first.state_dict())
    saver = Checkpoint({"trainer": second}, tmp_path, "latest", n_saved=2, background=False)
    saver.attach(second, Events.ITERATION_COMPLETED)
    second.run(range(6))
    names = sorted(c.path.name for c in saver.store.checkpoints())
    assert names == ["best_step_00000004", "latest_step_00000005", "latest_step_00000006"]
