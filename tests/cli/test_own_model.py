"""A model of the user's in ``ember train``: an NNX module through every command, and what is refused."""

import re
import sys

import numpy as np
import pytest

from ember.cli import main

#: A small NNX classifier for the digits, with the state NNX keeps (batch statistics, a dropout stream).
NNX_MODELS = '''
from flax import nnx


class NnxCNN(nnx.Module):
    def __init__(self, hidden: int = 32, num_classes: int = 10, *, rngs: nnx.Rngs):
        self.conv = nnx.Conv(1, 8, (3, 3), rngs=rngs)
        self.bn = nnx.BatchNorm(8, rngs=rngs)
        self.dense = nnx.Linear(8 * 8 * 8, hidden, rngs=rngs)
        self.dropout = nnx.Dropout(0.1, rngs=rngs)
        self.out = nnx.Linear(hidden, num_classes, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.bn(self.conv(x)))
        return self.out(self.dropout(nnx.relu(self.dense(x.reshape(x.shape[0], -1)))))


class Fixed(nnx.Module):
    """No rngs: its weights are its own."""

    def __init__(self, scale: float = 1.0):
        self.scale = nnx.Param(scale)

    def __call__(self, x):
        return x.reshape(x.shape[0], -1)[:, :10] * self.scale


def make():
    return NnxCNN(rngs=nnx.Rngs(0))


class Plain:
    pass
'''


def nnx_run(folder, monkeypatch):
    """A 3-iteration ``ember train`` run of ``NnxCNN`` (``hidden: 8``) in ``folder``, its module beside it: the run."""
    (folder / "mymodels.py").write_text(NNX_MODELS)
    monkeypatch.setattr(sys, "path", [str(folder), *sys.path])
    monkeypatch.delitem(sys.modules, "mymodels", raising=False)
    config = folder / "run.yaml"
    config.write_text("model:\n  name: 'mymodels:NnxCNN'\n  args: {hidden: 8}\ntrainer:\n  max_iters: 3\n")
    assert main(["train", str(config), "handlers.progress=false", f"--output={folder / 'run'}"]) == 0
    return folder / "run"


@pytest.fixture
def models(tmp_path, monkeypatch):
    """``mymodels.py`` in a folder of its own, beside a config naming its NNX module; the folder."""
    (tmp_path / "mymodels.py").write_text(NNX_MODELS)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.delitem(sys.modules, "mymodels", raising=False)  # another test's module of that name, imported before
    yield tmp_path
    sys.modules.pop("mymodels", None)


def test_an_nnx_module_trains_and_every_command_serves_it(models, capsys):
    """Train (its rngs from trainer.seed: two runs equal), eval (the run's own numbers), inspect, plan."""
    config = models / "run.yaml"
    config.write_text("model:\n  name: 'mymodels:NnxCNN'\n  args: {hidden: 16}\ntrainer:\n  max_epochs: 1\n")
    for run in ("a", "b"):
        assert main(["train", str(config), "handlers.progress=false", f"--output={models / run}"]) == 0
    out = capsys.readouterr().out
    validations = re.findall(r"^epoch   1  iteration    22  val accuracy (\S+)  val loss (\S+)$", out, re.M)
    assert len(validations) == 2, out
    assert validations[0] == validations[1], out
    accuracy, loss = validations[0]
    assert float(accuracy) > 0.5  # it learnt: 10 classes, one epoch
    assert main(["eval", str(models / "a")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"step_00000022 (iteration 22): val/accuracy {accuracy}  val/loss {loss}"
    )
    assert main(["inspect", str(models / "a" / "checkpoints" / "latest")]) == 0
    listed = capsys.readouterr().out
    for leaf in ("params.dense.kernel", "model_state.bn.mean", "model_state.dropout.rngs.key"):
        assert leaf in listed, listed
    assert main(["plan", str(config)]) == 0
    assert re.search(r"^needs [\d.]+ [KM]iB per device", capsys.readouterr().out, re.M)
    assert main(["export", str(models / "a"), str(models / "w.msgpack"), "--take", "model"]) == 0
    assert _exported_accuracy(models / "w.msgpack") == float(accuracy)  # the weights out score as the run did


def _exported_accuracy(path):
    """An NNX module of the user's, filled from ``ember export``'s file as the docs show, on the validation set."""
    import mymodels  # type: ignore[import-not-found]  # written by the test
    from flax import nnx, serialization

    from ember.cli import load_config
    from ember.cli._registry import build_data

    weights = serialization.msgpack_restore(path.read_bytes())
    model = mymodels.NnxCNN(hidden=16, rngs=nnx.Rngs(0))
    for kind, part in ((nnx.Param, "params"), (nnx.BatchStat, "model_state")):  # the RNG streams left as they are
        state = nnx.state(model, kind)
        nnx.replace_by_pure_dict(state, {name: value for name, value in weights[part].items() if name in state})
        nnx.update(model, state)
    model.eval()
    _, val, _ = build_data(load_config({}).data)
    batch = next(iter(val))
    return round(float(np.mean(np.argmax(model(batch["x"]), -1) == batch["y"])), 4)


def test_an_nnx_module_resumes_bit_for_bit(models, capsys):
    """`ember verify-resume` on an NNX module with batch statistics and dropout: a SIGKILL and a relaunch, exact."""
    config = models / "run.yaml"
    config.write_text("model:\n  name: 'mymodels:NnxCNN'\n")
    assert main(["verify-resume", str(config), "--steps", "30", "--workdir", str(models / "runs")]) == 0
    out = capsys.readouterr().out
    assert "  the rest of the state: 6 arrays equal bit for bit" in out.splitlines(), out
    assert out.splitlines()[-1] == "resume is exact: bit for bit.", out


def test_an_nnx_module_without_rngs_is_built_as_it_is(models):
    """A module whose __init__ takes no rngs is given none; its own arguments are checked and passed."""
    from ember.cli import load_config
    from ember.cli._registry import build_model

    build = build_model(load_config({"model": {"name": "mymodels:Fixed", "args": {"scale": 2.0}}}).model)
    assert build.__name__ == "Fixed"
    assert float(build().scale.get_value()) == 2.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["model.name=mymodels:make"],
            "model.name: 'mymodels:make' is a function; expected a flax.linen.Module or a flax.nnx.Module subclass.",
        ),
        (
            ["model.name=mymodels:Plain"],
            "model.name: 'mymodels:Plain' is the class Plain; expected a flax.linen.Module or a flax.nnx.Module "
            "subclass.",
        ),
        (
            ["model.name=mymodels:NnxCNN", "model.args={rngs: 1}"],
            "model.args.rngs: ember gives an NNX module its rngs (nnx.Rngs(trainer.seed)); leave it out of model.args.",
        ),
        (
            ["model.name=mymodels:NnxCNN", "model.args={hiden: 3}"],
            "model.args.hiden: NnxCNN takes no argument 'hiden'; did you mean 'hidden'? (it takes: hidden, "
            "num_classes)",
        ),
        (
            ["model.name=mymodels:Fixed", "model.args={scale: 1.0, rngs: 1}"],
            "model.args.rngs: Fixed takes no argument 'rngs' (it takes: scale)",
        ),
        (
            ["model.name=mymodels:NnxCNN", "model.args={hidden: [3]}"],
            "model.args: NnxCNN does not take {'hidden': [3]} (Shapes must be 1D sequences of concrete values of "
            "integer type, got (512, [3]).).",
        ),
    ],
)
def test_what_is_not_a_model_class_or_not_its_arguments_is_refused_in_one_line(models, capsys, args, message):
    """Before any run folder is made: status 2, one line naming the key, what was given and what is accepted."""
    assert main(["train", *args, f"--output={models / 'run'}"]) == 2
    assert capsys.readouterr().err == f"ember: error: {message}\n"
    assert not (models / "run").exists()


def test_an_nnx_module_that_cannot_take_the_datas_inputs_is_named_before_training(models, capsys):
    """Flat inputs into the NNX CNN: one line naming the model and the batch's shape, and no run folder."""
    np.save(models / "x.npy", np.zeros((50, 7), np.float32))
    np.save(models / "y.npy", np.zeros(50, np.int32))
    args = ["model.name=mymodels:NnxCNN", "data.name=npy", f"data.path={models}", "data.batch_size=8"]
    assert main(["train", *args, f"--output={models / 'run'}"]) == 2
    assert capsys.readouterr().err == (
        "ember: error: model 'mymodels:NnxCNN' cannot take the data's inputs: one batch of x is float32[1, 7] "
        "(ValueError: operands could not be broadcast together with shapes (0,) (2,)). Run with --debug for the "
        "traceback.\n"
    )
    assert not (models / "run").exists()
