"""`init_from`: fine-tuning from another run, partial restore, and the report of what was taken."""

import re
import shutil
import sys

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from ember.checkpoint import InitReport, init_from, open_store
from ember.cli import MLP, load_config, main
from ember.cli._registry import build_optimizer, build_schedule
from ember.training import TrainState, create_trainer
from tests.cli.test_own_model import nnx_run
from tests.conftest import stored

X = np.zeros((1, 8, 8, 1), np.float32)


def new_state(classes=2, tx=None):
    """The MLP with a new head of ``classes`` outputs and SGD: what a fine-tuning run starts from."""
    return TrainState.from_linen(MLP(num_classes=classes), X, tx or optax.sgd(0.01), seed=7)


def test_fine_tuning_takes_the_body_leaves_the_new_head_fresh_and_trains_with_another_optimizer(mlp_run):
    """The issue's case: the digits run's weights, SGD instead of AdamW, a new 2-class head; then it trains."""
    fresh = new_state()
    state, report = init_from(fresh, mlp_run, fresh=["params.Dense_1"])
    saved, _ = stored(mlp_run)
    assert report.loaded == ["params.Dense_0.bias", "params.Dense_0.kernel"]
    assert report.fresh == {
        "params.Dense_1.bias": "fresh: params.Dense_1",
        "params.Dense_1.kernel": "fresh: params.Dense_1",
    }
    assert report.not_taken == ["step", "rng"]  # SGD's state is empty: no optimizer leaves at all
    assert report.unused == ["params.Dense_1.bias", "params.Dense_1.kernel"]  # the old 10-class head
    assert report.source == str(mlp_run / "checkpoints" / "latest" / "step_00000022")
    np.testing.assert_array_equal(np.asarray(state.params["Dense_0"]["kernel"]), saved["params.Dense_0.kernel"])
    np.testing.assert_array_equal(np.asarray(state.params["Dense_1"]["kernel"]), fresh.params["Dense_1"]["kernel"])
    assert int(state.step) == 0
    trainer = create_trainer(state, lambda model, batch: optax.l2_loss(model(batch["x"])).mean())
    trainer.run([{"x": np.ones((4, 8, 8, 1), np.float32)}] * 3, max_epochs=1)
    assert trainer.state.iteration == 3
    assert str(report).splitlines() == [
        f"from {report.source}: 2 loaded, 2 left fresh, 2 not taken, 2 unused in the source",
        "  left fresh: params.Dense_1.bias (fresh: params.Dense_1)",
        "  left fresh: params.Dense_1.kernel (fresh: params.Dense_1)",
        "  unused: params.Dense_1.bias",
        "  unused: params.Dense_1.kernel",
    ]


def test_params_and_opt_state_and_everything_resume_the_source_exactly(mlp_run):
    """The same model and AdamW: ``params_and_opt_state`` takes both; ``all`` the step and the RNG too."""
    saved, _ = stored(mlp_run)
    cfg = load_config({}).optimizer  # the run's own optimizer: AdamW after clipping, on a cosine schedule
    target = TrainState.from_linen(MLP(), X, build_optimizer(cfg, build_schedule(cfg, 22)), seed=3)
    _, both = init_from(target, mlp_run, take="params_and_opt_state")
    assert both.not_taken == ["step", "rng"]
    assert both.fresh == {}
    everything, report = init_from(target, mlp_run, take="all")
    assert sorted(report.loaded) == sorted(n for n in saved if not n.startswith("opt_state.1.1"))  # no empty states
    assert report.fresh == {}
    assert report.unused == []
    assert int(everything.step) == 22
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(everything.rng)), saved["rng"])


def test_from_the_files_ember_export_writes_with_names_renamed(mlp_run, tmp_path):
    """.msgpack and .safetensors round trips; ``rename`` maps the source's names onto a model named otherwise."""
    saved, _ = stored(mlp_run)
    for out in ("w.msgpack", "w.safetensors"):
        assert main(["export", str(mlp_run), str(tmp_path / out)]) == 0
        state, report = init_from(new_state(10), tmp_path / out)
        assert report.loaded == [
            f"params.{layer}.{leaf}" for layer in ("Dense_0", "Dense_1") for leaf in ("bias", "kernel")
        ]
        assert report.source == str(tmp_path / out)
        for name in report.loaded:
            layer, leaf = name.split(".")[1:]
            np.testing.assert_array_equal(np.asarray(state.params[layer][leaf]), saved[name])
    target = {"encoder": {"w": np.zeros((64, 128), np.float32)}, "head": {"w": np.zeros((128, 3), np.float32)}}
    tree, report = init_from(
        target, tmp_path / "w.msgpack", take="all", rename={r"^params\.Dense_0\.kernel$": "encoder.w"}, fresh=["head"]
    )
    np.testing.assert_array_equal(tree["encoder"]["w"], saved["params.Dense_0.kernel"])
    assert report.loaded == ["encoder.w"]
    assert report.fresh == {"head.w": "fresh: head"}
    assert report.unused == ["params.Dense_0.bias", "params.Dense_1.bias", "params.Dense_1.kernel"]


def test_a_mismatch_is_refused_naming_each_leaf_and_strict_false_leaves_what_the_source_lacks_fresh(mlp_run, tmp_path):
    with pytest.raises(ValueError, match="^" + re.escape(
        f"{mlp_run / 'checkpoints' / 'latest' / 'step_00000022'} does not fit the target (2 leaves); leave them fresh "
        "with `fresh=[...]` (or `strict=False` for leaves the source lacks), or map names with `rename`:\n"
        "  params.Dense_1.bias: the source has float32[10], the target float32[2]\n"
        "  params.Dense_1.kernel: the source has float32[128, 10], the target float32[128, 2]"
    ) + "$"):  # fmt: skip
        init_from(new_state(), mlp_run)
    target = {"params": {"Dense_0": {"kernel": np.zeros((64, 128), np.float32)}, "extra": np.zeros(3, np.float32)}}
    with pytest.raises(ValueError, match=r"\n  params\.extra: not in the source$"):
        init_from(target, mlp_run)
    tree, report = init_from(target, mlp_run, strict=False)
    assert report.fresh == {"params.extra": "not in the source"}
    assert report.loaded == ["params.Dense_0.kernel"]
    assert tree["params"]["extra"].tolist() == [0.0, 0.0, 0.0]


def test_an_nnx_state_from_an_nnx_run_and_from_its_export(tmp_path, monkeypatch):
    """NNX's ``.value`` is left out of the names on both sides; its batch statistics come with ``take="all"``."""
    nnx_run(tmp_path, monkeypatch)
    import mymodels  # type: ignore[import-not-found]  # written above

    target = TrainState.from_nnx(mymodels.NnxCNN(hidden=8, num_classes=3, rngs=nnx.Rngs(1)), optax.sgd(0.1))
    saved, _ = stored(tmp_path / "run")
    state, report = init_from(target, tmp_path / "run", fresh=["params.out"])
    assert report.loaded == [
        f"params.{p}" for p in ("bn.bias", "bn.scale", "conv.bias", "conv.kernel", "dense.bias", "dense.kernel")
    ]
    np.testing.assert_array_equal(np.asarray(state.params["dense"]["kernel"][...]), saved["params.dense.kernel.value"])
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "w.msgpack"), "--take", "model"]) == 0
    same = TrainState.from_nnx(mymodels.NnxCNN(hidden=8, rngs=nnx.Rngs(1)), optax.sgd(0.1))
    state, report = init_from(same, tmp_path / "w.msgpack", take="all", strict=False)
    assert sorted(report.fresh) == ["rng", "step"]  # an export holds the model, not the trainer's counters
    np.testing.assert_array_equal(np.asarray(state.model_state["bn"]["mean"][...]), saved["model_state.bn.mean.value"])
    sys.modules.pop("mymodels", None)


def test_the_best_checkpoint_a_step_and_one_checkpoints_folder(mlp_run):
    best = open_store(mlp_run / "checkpoints" / "best").checkpoints()[-1]
    _, report = init_from(new_state(10), mlp_run, checkpoint="best")
    assert report.source == str(best.path)
    _, report = init_from(new_state(10), mlp_run / "checkpoints" / "latest", checkpoint=22)
    assert report.source == str(mlp_run / "checkpoints" / "latest" / "step_00000022")
    _, report = init_from(new_state(10), best.path)
    assert report.source == str(best.path)
    with pytest.raises(FileNotFoundError, match=re.escape("holds no checkpoint of step 7; it holds steps [22].")):
        init_from(new_state(10), mlp_run, checkpoint=7)


def test_a_damaged_checkpoint_is_refused_naming_its_file(mlp_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(mlp_run, copy)
    info = open_store(copy / "checkpoints" / "latest").latest()
    arrays = next(p for p in info.path.iterdir() if p.suffix == ".msgpack")
    data = bytearray(arrays.read_bytes())
    data[len(data) // 2] ^= 0xFF
    arrays.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=re.escape(arrays.name)):
        init_from(new_state(10), info.path)


TAKE = "`take` must be one of ['all', 'params', 'params_and_opt_state'], got 'weights'."
FRESH = "`fresh` must be a list of names of the target's subtrees, got the string 'params.Dense_1'."


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"take": "weights"}, ValueError, TAKE),
        ({"fresh": "params.Dense_1"}, TypeError, FRESH),
        ({"name": "model"}, ValueError, "step_00000022 holds no object 'model'; it holds ['trainer']."),
        (
            {"rename": {"^params[.]encoder": "params.body"}},
            ValueError,
            "`rename` rule '^params[.]encoder' matches no name of {latest} (its names: params.Dense_0.bias, "
            "params.Dense_0.kernel, params.Dense_1.bias, params.Dense_1.kernel, ... (16 in all)).",
        ),
        ({"rename": {"params[": "x"}}, ValueError, "`rename` rule 'params[' is not a regular expression ("),
        (
            {"fresh": ["params.head"]},
            ValueError,
            "`fresh` names 'params.head', which is no leaf or subtree of the target (its names: params.Dense_0.bias, "
            "params.Dense_0.kernel, params.Dense_1.bias, params.Dense_1.kernel, ... (6 in all)).",
        ),
    ],
)
def test_bad_arguments_are_refused_by_name(mlp_run, kwargs, error, message):
    latest = mlp_run / "checkpoints" / "latest" / "step_00000022"
    said = re.escape(message.format(latest=latest))
    with pytest.raises(error, match=said + ("" if message.endswith("(") else "$")):
        init_from(new_state(10), mlp_run, **kwargs)


def test_a_source_that_is_not_one_is_named(tmp_path):
    nothing = tmp_path / "nothing"
    said = f"`source` {nothing} is neither a .msgpack or .safetensors file nor a folder of checkpoints or a run."
    with pytest.raises(FileNotFoundError, match=re.escape(said)):
        init_from(new_state(), nothing)
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path} holds no valid checkpoint.")):
        init_from(new_state(), tmp_path)


def test_an_init_report_reads_as_it_prints():
    report = InitReport("a", ["x"], {}, [], [])
    assert str(report) == "from a: 1 loaded, 0 left fresh, 0 not taken, 0 unused in the source"


@pytest.mark.parametrize("suffix", [".msgpack", ".safetensors"])
def test_a_truncated_export_is_refused_naming_the_file(mlp_run, tmp_path, suffix):
    whole = tmp_path / f"w{suffix}"
    assert main(["export", str(mlp_run), str(whole)]) == 0
    cut = tmp_path / f"cut{suffix}"
    cut.write_bytes(whole.read_bytes()[:1000])
    with pytest.raises(ValueError, match=f"^{re.escape(str(cut))} is not a whole {re.escape(suffix)} file of arrays"):
        init_from(new_state(10), cut)


def test_a_checkpoint_missing_a_file_is_refused_and_a_relative_source_is_read(mlp_run, tmp_path, monkeypatch):
    copy = tmp_path / "run"
    shutil.copytree(mlp_run, copy)
    monkeypatch.chdir(tmp_path)
    _, report = init_from(new_state(10), "run")  # relative to where it is called
    assert report.source == "run/checkpoints/latest/step_00000022"  # as it was named
    info = open_store(copy / "checkpoints" / "latest").latest()
    (info.path / "state.msgpack").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape("run/checkpoints/latest holds no valid checkpoint.")):
        init_from(new_state(10), "run")
    with pytest.raises(ValueError, match=re.escape("state.msgpack")):
        init_from(new_state(10), info.path)


@pytest.mark.parametrize("damage", ["truncated", "metadata deleted"])
def test_an_orbax_checkpoint_cut_short_is_refused_naming_it(tmp_path, damage):
    """A checkpoint Orbax wrote itself (as ``ember export --format orbax`` does): read whole, or refused."""
    import orbax.checkpoint as ocp

    weights = {"params": {"w": np.arange(1000, dtype=np.float32)}}
    path = tmp_path / "w"
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, weights)
        checkpointer.wait_until_finished()
    target = {"params": {"w": np.zeros(1000, np.float32)}}
    tree, report = init_from(target, path)
    assert (tree["params"]["w"].tolist(), report.loaded) == (list(range(1000)), ["params.w"])
    if damage == "truncated":
        data = max((path / "ocdbt.process_0" / "d").iterdir(), key=lambda p: p.stat().st_size)
        data.write_bytes(data.read_bytes()[:100])
    else:
        (path / "_METADATA").unlink()
    with pytest.raises(ValueError, match=re.escape(f"{path} is not a whole Orbax checkpoint of arrays (")):
        init_from(target, path)


def test_a_checkpoint_of_two_trainers_is_read_from_the_one_name_names(tmp_path):
    """A distillation run's checkpoint holds a student and a teacher: ``name`` picks one; without it, both named."""
    import jax.numpy as jnp

    from ember.handlers import Checkpoint

    def trainer_of(value):
        state = TrainState.create(lambda p, x: x * p["w"], {"w": jnp.full(3, value)}, optax.sgd(0.1))
        return create_trainer(state, lambda model, batch: model(batch).mean())

    student, teacher = trainer_of(1.0), trainer_of(2.0)
    Checkpoint({"student": student, "teacher": teacher}, tmp_path, background=False).save_now(student)
    target = TrainState.create(lambda p, x: x * p["w"], {"w": jnp.zeros(3)}, optax.adam(0.1))
    with pytest.raises(ValueError, match=re.escape("holds the objects ['student', 'teacher']; name the one to read")):
        init_from(target, tmp_path)
    state, report = init_from(target, tmp_path, name="teacher")
    assert (state.params["w"].tolist(), report.loaded) == ([2.0, 2.0, 2.0], ["params.w"])
    assert init_from(target, tmp_path, name="student")[0].params["w"].tolist() == [1.0, 1.0, 1.0]
