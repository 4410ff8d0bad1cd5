"""Checkpoint as Ignite 0.5.5's documented lines use it, round two (issue 47's handler items).

Ignite's results below were recorded with torch 2.13.0 (CPU) and pytorch-ignite 0.5.5 running the same lines
(``Checkpoint(to_save, handler, score_function=lambda e: 0.77)`` called once on an engine at iteration 0; a
``Checkpoint`` on ``EXCEPTION_RAISED`` of a run failing at iteration 3; ``load_objects`` missing a key).
"""

import re
import threading

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ember import Engine, Events
from ember.checkpoint import open_store
from ember.handlers import Checkpoint, CheckpointEvents
from ember.training import TrainState, create_trainer
from tests.slow_writes import held_checkpoint_writes


def _trainer():
    state = TrainState.create(lambda p, x: x @ p["w"], {"w": jnp.ones((4, 2))}, optax.sgd(0.1))
    return create_trainer(state, lambda model, batch: (model(batch) ** 2).mean())


BATCHES = [np.ones((2, 4), np.float32)] * 4


def test_a_score_without_a_score_name_names_files_and_metadata_as_ignite():
    calls = []
    engine = Engine(lambda e, b: b)
    saver = Checkpoint({"trainer": engine}, lambda c, f, m: calls.append((f, m)), score_function=lambda e: 0.77)
    saver(engine)
    # Ignite 0.5.5: ('trainer_0.7700.pt', {'basename': 'trainer', 'score_name': None, 'priority': 0.77})
    assert calls == [("trainer_0.7700.ckpt", {"basename": "trainer", "score_name": None, "priority": 0.77})]
    assert saver.score_name is None
    # Ignite 0.5.5: OrderedDict([('_saved', [(0.77, 'trainer_0.7700.pt')])])
    assert saver.state_dict() == {"_saved": [(0.77, "trainer_0.7700.ckpt")]}


def test_a_score_without_a_score_name_is_recorded_as_score_in_a_store(tmp_path):
    engine = Engine(lambda e, b: b)
    engine.run([1, 2])
    info = Checkpoint({"trainer": engine}, tmp_path, score_function=lambda e: 0.77).save_now(engine)
    assert (info.path.name, info.metrics) == ("step_00000002-score=0.7700", {"score": 0.77})
    again = Checkpoint({"trainer": Engine(lambda e, b: b)}, tmp_path, score_function=lambda e: 0.5)
    assert again.state_dict() == {"_saved": [(0.77, "step_00000002-score=0.7700")]}  # a relaunch knows its best


def test_a_one_argument_save_handler_is_refused_when_the_checkpoint_is_made():
    """Ignite accepts it and fails at the first save, after training up to it; ember refuses it at once.

    Ignite's error, with Ignite's exception type: ``TypeError: <lambda>() takes 1 positional argument but 2 were
    given``.
    """

    def one(checkpoint):
        pass

    with pytest.raises(
        TypeError,
        match=re.escape(
            "`save_handler` must take (checkpoint, filename, metadata) or (checkpoint, filename), as Ignite calls "
            "it; test_a_one_argument_save_handler_is_refused_when_the_checkpoint_is_made.<locals>.one(checkpoint) "
            "does not."
        ),
    ):
        Checkpoint({"trainer": Engine(lambda e, b: b)}, one)


def test_load_objects_missing_a_key_raises_value_error_as_ignite(tmp_path):
    # Ignite 0.5.5: ValueError("Key 'b' from x is not found in y: dict_keys(['a'])")
    engine = Engine(lambda e, b: b)
    with pytest.raises(ValueError, match=re.escape("The checkpoint holds no state for ['b']; it holds ['a'].")):
        Checkpoint.load_objects({"a": engine, "b": engine}, {"a": engine.state_dict()})
    engine.run([1])
    Checkpoint({"a": engine}, tmp_path, background=False)(engine)
    with pytest.raises(ValueError, match=re.escape("'step_00000001' holds no state for ['b']; it holds ['a'].")):
        Checkpoint.load_objects({"a": engine, "b": engine}, tmp_path)


@pytest.mark.parametrize("where", ["store", "save handler"])
def test_a_checkpoint_on_exception_raised_saves_the_failed_runs_state(tmp_path, where):
    """Ignite's "save on exception": the handler gets the engine (not the exception) and saves.

    The checkpoint of the iteration the run failed in is written (on disk, for a background store) before the
    exception goes on.
    """
    calls = []

    def fails_at_3(engine, batch):
        if engine.state.iteration == 3:
            raise ZeroDivisionError("division by zero")

    engine = Engine(fails_at_3)
    handler = tmp_path if where == "store" else (lambda c, f, m: calls.append((f, c)))
    saver = Checkpoint({"trainer": engine}, handler)
    engine.add_event_handler(Events.EXCEPTION_RAISED, saver)
    with pytest.raises(ZeroDivisionError, match="division by zero"):
        engine.run([1, 2, 3, 4])
    if where == "store":  # Ignite 0.5.5 with a DiskSaver: ['model_3.pt']
        assert not saver.store.writing
        [info] = saver.store.checkpoints()
        assert (info.path.name, info.manifest["metadata"]["state_dicts"]["trainer"]["iteration"]) == (
            "step_00000003",
            3,
        )
    else:
        assert [f for f, _ in calls] == ["trainer_3.ckpt"]
        assert calls[0][1]["iteration"] == 3


def test_saved_checkpoint_fires_after_each_checkpoint_written_and_leaves_the_event_name(tmp_path):
    engine = Engine(lambda e, b: b)
    scores = iter([0.5, 0.9, 0.7, 0.6])
    saver = Checkpoint({"trainer": engine}, tmp_path, n_saved=2, score_function=lambda e: next(scores))
    assert Checkpoint.SAVED_CHECKPOINT is CheckpointEvents.SAVED_CHECKPOINT
    saver.attach(engine, Events.EPOCH_COMPLETED)
    heard = []
    engine.add_event_handler(Checkpoint.SAVED_CHECKPOINT, lambda e: heard.append(("saved", e.state.epoch)))
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: heard.append(("after", e.last_event_name)))
    engine.run([1], max_epochs=4)
    # 0.6 is below the two kept (0.9, 0.7): not written, not announced
    after = ("after", Events.EPOCH_COMPLETED)
    assert heard == [("saved", 1), after, ("saved", 2), after, ("saved", 3), after, after]


def test_saved_checkpoint_is_registered_at_the_first_save_as_in_ignite():
    engine = Engine(lambda e, b: b)
    saver = Checkpoint({"trainer": engine}, lambda c, f: None)
    with pytest.raises(ValueError, match=r"CheckpointEvents.SAVED_CHECKPOINT is not an event of this engine"):
        engine.add_event_handler(Checkpoint.SAVED_CHECKPOINT, lambda: None)
    engine.add_event_handler(Events.COMPLETED, saver)
    engine.run([1])
    assert engine.has_registered_events(Checkpoint.SAVED_CHECKPOINT)


def test_load_objects_waits_for_the_checkpoint_being_written_and_loses_nothing(tmp_path, monkeypatch):
    """Loading ``last_checkpoint`` while its background write is in flight waits for its files.

    Nothing is created at its path meanwhile, and the write then commits (before: an empty folder there, the write
    failing with FileExistsError and the checkpoint lost).
    """
    release = held_checkpoint_writes(monkeypatch)
    trainer = _trainer()
    saver = Checkpoint({"trainer": trainer}, tmp_path)
    saver.attach(trainer, Events.ITERATION_COMPLETED(once=2))
    seen = []

    def load_it(engine):
        path = saver.last_checkpoint
        seen.append(path.exists())
        threading.Timer(0.3, release.set).start()  # released later: the load must wait for it, however late
        fresh = _trainer()
        seen.append(Checkpoint.load_objects({"trainer": fresh}, path).step)
        seen.append(fresh.state.iteration)

    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=2), load_it)
    trainer.run(BATCHES)
    assert seen == [False, 2, 2]
    assert [c.path.name for c in saver.store.checkpoints()] == ["step_00000002"]


def test_load_objects_from_a_missing_folder_creates_nothing(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"No valid checkpoint in .*nowhere to load from: there is no such"):
        Checkpoint.load_objects({"trainer": Engine(lambda e, b: b)}, tmp_path / "nowhere")
    assert list(tmp_path.iterdir()) == []


def test_a_second_checkpoint_into_the_folder_an_attached_one_writes_is_refused_at_attach(tmp_path):
    """A notebook cell run twice on one trainer: refused in one line naming the folder.

    Once every attachment of the first is removed the new one attaches; another folder, or the same handler on a second
    event, is fine.
    """
    trainer = Engine(lambda e, b: b)
    first = Checkpoint({"trainer": trainer}, tmp_path / "ckpt")
    handle = first.attach(trainer)
    again = Checkpoint({"trainer": trainer}, tmp_path / "ckpt")
    with pytest.raises(ValueError, match="Another Checkpoint") as refused:
        again.attach(trainer)
    assert str(refused.value) == (
        f"Another Checkpoint attached to this engine writes into {tmp_path / 'ckpt'}: remove it first "
        "(handle.remove() on the handle its attach returned), or give this one another folder."
    )
    Checkpoint({"trainer": trainer}, tmp_path / "other").attach(trainer)
    second = first.attach(trainer, Events.COMPLETED)  # the same handler on a second event
    handle.remove()
    with pytest.raises(ValueError, match="Another Checkpoint"):  # its second attachment still holds the folder
        again.attach(trainer)
    second.remove()
    again.attach(trainer)
    assert again.attach(Engine(lambda e, b: b)) is not None  # another engine: its own folders


def _model(**params):
    """A trainer over ``params`` (names to shapes), each filled with its position in the list plus one."""
    filled = {name: jnp.full(shape, float(i + 1)) for i, (name, shape) in enumerate(params.items())}
    return create_trainer(TrainState.create(lambda p, x: x, filled, optax.sgd(0.1)), lambda m, b: m(b).mean())


def _pretrained(tmp_path, names=("trainer",)):
    """A trainer with a body and an old head, saved under each of ``names``; the folder."""
    source = _model(body=(3,), old_head=(2,))
    source.state.train_state = source.state.train_state.replace(
        params={"body": jnp.full(3, 7.0), "old_head": jnp.full(2, 9.0)}
    )
    Checkpoint(dict.fromkeys(names, source), tmp_path, background=False).save_now(source)
    return tmp_path


STRICT_FALSE_WARNING = (
    "load_objects(strict=False): 'trainer' keeps 1 of its arrays as they were, not in the checkpoint "
    "(params.new_head), and 1 of the checkpoint's are not in 'trainer' (params.old_head)."
)


@pytest.mark.parametrize("source", ["store", "dict"])
def test_strict_false_loads_the_shared_arrays_keeps_the_rest_and_warns_of_both(tmp_path, source):
    """Ignite's ``load_objects(..., strict=False)`` (transfer learning): what both have is loaded, the rest named."""
    folder = _pretrained(tmp_path)
    checkpoint = folder if source == "store" else _as_dict(folder)
    target = _model(body=(3,), new_head=(4,))
    strict = {
        "store": "missing from the checkpoint: trainer/params.new_head\n  not in the target: trainer/params.old_head",
        "dict": "missing: params.new_head; not in trainer: params.old_head",
    }
    with pytest.raises(ValueError, match=re.escape(strict[source])):
        Checkpoint.load_objects({"trainer": target}, checkpoint)  # strict by default, as Ignite
    assert target.state.train_state.params["body"].tolist() == [1.0, 1.0, 1.0]  # the refusal changed nothing
    with pytest.warns(UserWarning, match=re.escape(STRICT_FALSE_WARNING)):
        Checkpoint.load_objects({"trainer": target}, checkpoint, strict=False)
    params = target.state.train_state.params
    assert (params["body"].tolist(), params["new_head"].tolist()) == ([7.0] * 3, [2.0] * 4)


def _as_dict(folder):
    """The checkpoint in ``folder`` as a save handler of yours would have received it (Ignite's in-memory dict)."""
    trees, info = open_store(folder).restore()
    states = info.manifest["metadata"]["state_dicts"]
    return {name: {"state_dict": states[name], "tree_state_dict": tree} for name, tree in trees.items()}


@pytest.mark.parametrize("source", ["store", "dict"])
def test_strict_false_still_refuses_another_shape_and_changes_nothing(tmp_path, source):
    """As torch's ``load_state_dict(strict=False)``: a size mismatch is an error; no object of ``to_load`` changes."""
    folder = _pretrained(tmp_path, ("trainer", "other"))
    checkpoint = folder if source == "store" else _as_dict(folder)
    target, other = _model(body=(5,), old_head=(2,)), _model(body=(3,), old_head=(2,))
    other_params = dict(other.state.train_state.params)
    where = "The checkpoint 'step_00000000'" if source == "store" else "`checkpoint['trainer']['tree_state_dict']`"
    message = f"{where} does not fit trainer: params.body: the checkpoint has float32[3], trainer float32[5]"
    with pytest.raises(ValueError, match=re.escape(message)):
        Checkpoint.load_objects({"other": other, "trainer": target}, checkpoint, strict=False)
    assert target.state.train_state.params["body"].tolist() == [1.0] * 5
    assert other.state.train_state.params == other_params  # it fits, but is not loaded either


def test_strict_false_still_needs_every_object_of_to_load_in_the_checkpoint(tmp_path):
    """Ignite's ``strict`` goes to each object's ``load_state_dict``; a key of ``to_load`` missing is still an error."""
    folder = _pretrained(tmp_path)
    with pytest.raises(ValueError, match=re.escape("The checkpoint 'step_00000000' holds no arrays for 'third'.")):
        Checkpoint.load_objects({"third": _model(body=(3,)), "trainer": _model(body=(3,))}, folder, strict=False)
    with pytest.raises(TypeError, match=re.escape("`strict` must be True or False, got 'no'.")):
        Checkpoint.load_objects({"trainer": _model(body=(3,))}, folder, strict="no")  # type: ignore[arg-type]
