"""The ``ember`` command end to end: the embedded digits run, resume, inspect, plot, errors."""

import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from ember import __version__
from ember._ledger_file import CATEGORIES
from ember.cli import ConfigError, load_config, main, train
from tests.subprocesses import devices as xla_devices
from tests.subprocesses import run_python

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """``ember train`` with no config (the embedded run) in a temporary run folder."""
    run = tmp_path_factory.mktemp("digits")
    assert main(["train", "--output", str(run)]) == 0
    return run


def test_the_default_run_reaches_97_percent(default_run, capsys):
    """The embedded run's accuracy and its run folder (its time is measured by benchmarks/workloads.py, digits)."""
    summary = json.loads((default_run / "summary.json").read_text())
    assert summary["best_accuracy"] >= 0.97
    assert summary["resumed_from"] is None
    assert sorted(p.name for p in default_run.iterdir()) == [
        "checkpoints",
        "config.yaml",
        "goodput.jsonl",
        "metrics.jsonl",
        "run.json",
        "summary.json",
        "tb",
    ]
    assert len(list((default_run / "checkpoints" / "best").iterdir())) == 1
    assert len(list((default_run / "checkpoints" / "latest").iterdir())) == 2
    rows = [json.loads(line) for line in (default_run / "metrics.jsonl").read_text().splitlines()]
    assert {"train/loss", "train/lr", "val/accuracy", "val/loss"} <= {k for r in rows for k in r}


def test_running_the_same_command_again_finds_nothing_left_without_importing_jax(default_run):
    """A relaunch of a finished run is answered from its files: two lines, status 0, and no JAX, Flax or optax."""
    code = (
        "import sys; from ember.cli import main; status = main(['train', '--output', sys.argv[1]]); "
        "print(status, sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'flax', 'optax', 'orbax'}))"
    )
    done = run_python(["-c", code, str(default_run)])
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == f"{default_run}: this run is already complete; nothing to do."
    assert re.fullmatch(
        rf"Done: \d+ epochs, \d+ iterations in [\d.]+ s; best val accuracy 0\.\d{{4}}\. Run folder: {default_run}",
        lines[1],
    )
    assert lines[2:] == ["0 []"]


def logged_records(run_dir):
    """The run's JSONL records, without their wall time."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in lines]


def test_a_finished_run_whose_last_checkpoint_is_gone_is_not_taken_for_finished(tmp_path, capsys):
    """The files must agree: a summary without its last checkpoint sends the relaunch through training again.

    No checkpoint writer thread outlives a run (a notebook trains many in one process), and the record of the
    launch whose checkpoint is gone is dropped with it: the log holds each record of the run once.
    """
    args = ["train", "--output", str(tmp_path), "trainer.max_epochs=1", "handlers.progress=false"]
    before = set(threading.enumerate())  # (earlier tests' threads may end meanwhile: only new ones count)
    started = lambda: [t.name for t in set(threading.enumerate()) - before if t.name.startswith("ember-checkpoint")]  # noqa: E731
    assert main([*args, "handlers.writers=[jsonl]"]) == 0
    assert started() == []
    logged = logged_records(tmp_path)
    latest = tmp_path / "checkpoints" / "latest"
    assert sorted(p.name for p in latest.iterdir()) == ["step_00000022"]
    shutil.rmtree(latest / "step_00000022")
    capsys.readouterr()
    assert main([*args, "handlers.writers=[jsonl]"]) == 0
    out = capsys.readouterr().out
    assert "already complete" not in out
    assert re.search(r"^epoch   1  iteration    22  val accuracy 0\.\d{4}", out, re.M), out
    assert sorted(p.name for p in latest.iterdir()) == ["step_00000022"]
    assert started() == []
    assert logged_records(tmp_path) == logged  # the run started over, and so did its record: each record once


def test_a_changed_config_is_refused_and_a_finished_run_keeps_its_record(tmp_path, capsys):
    """Relaunching with another config lists what differs and changes nothing; a no-op relaunch keeps the record."""
    config = {"trainer": {"max_epochs": 2}, "handlers": {"progress": False}, "output": str(tmp_path)}
    first = train(config)
    assert (first["epochs"], first["iterations"]) == (2, 44)
    record = {name: (tmp_path / name).read_text() for name in ("summary.json", "config.yaml")}
    event_files = sorted(p.name for p in (tmp_path / "tb").iterdir())
    changed = {**config, "trainer": {"max_epochs": 3}, "optimizer": {"learning_rate": 0.01}}
    with pytest.raises(ConfigError) as info:
        train(changed)
    assert str(info.value) == (
        f"{tmp_path} holds a run started with another config (optimizer.learning_rate: 0.003 -> 0.01; "
        "trainer.max_epochs: 2 -> 3). Continuing it with these changes would make one run of two configs. Train "
        f"into a new folder (set output:), or delete {tmp_path} to start over."
    )
    capsys.readouterr()
    assert main(["resume", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{tmp_path}: this run is already complete; nothing to do." in out
    assert re.search(
        r"^Done: 2 epochs, 44 iterations in [\d.]+ s; best val accuracy 0\.\d{4}\. Run folder: ", out, re.M
    )
    assert {name: (tmp_path / name).read_text() for name in record} == record
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == event_files


def test_inspect_and_plot(default_run, capsys):
    assert main(["inspect", str(default_run / "checkpoints" / "best")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^checkpoint step_\d{8}-val_accuracy=0\.9\d{3}$", out, flags=re.M)
    assert re.search(r"^    trainer/params\.Dense_1\.kernel +float32\[64, 10\]$", out, flags=re.M)
    assert re.search(r"^    early_stopping\.counter +\d+$", out, flags=re.M), out  # state dicts as numbers
    assert re.search(r"^    trainer\.attached\.metric:loss\.state +\(\d+\.\d+, \d+\)$", out, flags=re.M), out
    assert re.search(r"^    trainer\.data\.position +\d+$", out, flags=re.M), out
    assert "{'dtype'" not in out
    assert main(["plot", str(default_run)]) == 0
    capsys.readouterr()
    png = default_run / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(png.read_bytes()[16:20], "big")
    assert width == 4 * 500  # loss, learning rate, accuracy, and where the wall time went (goodput.jsonl)
    assert main(["goodput", str(default_run)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == f"{default_run}: 1 run"
    assert [line.split()[0] for line in table[2:11]] == [*CATEGORIES, "wall"]
    assert re.fullmatch(
        r"goodput: [\d.]+% of [\d.]+ s \(productive training steps over the wall time of every run\)", table[-2]
    )


def test_errors_are_one_line_with_exit_status_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_epoch: 3\n")
    assert main(["train", str(bad)]) == 2
    assert capsys.readouterr().err == (
        "ember: error: trainer.max_epoch: unknown field; did you mean 'max_epochs'? "
        "(allowed: compilation_cache, eval_every, max_epochs, max_iters, mesh, placement, precision, remat, "
        "rollback_after, rules, seed, skip_nonfinite, spike_factor, steps_per_call)\n"
    )
    assert main(["inspect", str(tmp_path / "none")]) == 2
    assert f"No checkpoint at {tmp_path / 'none'}." in capsys.readouterr().err
    assert main(["resume", str(tmp_path)]) == 2
    assert "has no config.yaml" in capsys.readouterr().err


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"ember {__version__}\n"


def test_distributed_launch_reads_all_three_variables_or_none(monkeypatch):
    from unittest import mock

    from ember.cli._distributed import start_distributed

    with mock.patch("jax.distributed.initialize") as init, mock.patch("jax.config.update") as update:
        assert start_distributed({}) == {}
        init.assert_called_once_with(heartbeat_timeout_seconds=30)  # JAX's detection, a lost process found in 30 s
        update.assert_called_once_with("jax_enable_recoverability", True)
        start_distributed({"EMBER_HEARTBEAT_TIMEOUT": "5"})
        assert init.call_args == mock.call(heartbeat_timeout_seconds=5)
    with pytest.raises(ValueError, match=re.escape("EMBER_HEARTBEAT_TIMEOUT must be a positive number of seconds")):
        start_distributed({"EMBER_HEARTBEAT_TIMEOUT": "soon"})
    with pytest.raises(ValueError, match=re.escape("--distributed got ['EMBER_COORDINATOR'] from the environment")):
        start_distributed({"EMBER_COORDINATOR": "h:1"})
    with pytest.raises(ValueError, match=re.escape("EMBER_NUM_PROCESSES and EMBER_PROCESS_ID must be ints")):
        start_distributed({"EMBER_COORDINATOR": "h:1", "EMBER_NUM_PROCESSES": "two", "EMBER_PROCESS_ID": "0"})


def test_a_model_module_beside_the_config_is_importable(tmp_path, monkeypatch):
    """model.name "mymodels:Tiny" imports mymodels.py from the config's folder, without PYTHONPATH."""
    (tmp_path / "mymodels.py").write_text(
        "from flax import linen as nn\n\n\nclass Tiny(nn.Module):\n    @nn.compact\n"
        "    def __call__(self, x, train: bool = False):\n        return nn.Dense(10)(x.reshape(x.shape[0], -1))\n"
    )
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model:\n  name: 'mymodels:Tiny'\ntrainer:\n  max_epochs: 1\nhandlers:\n  progress: false\n"
        f"output: {tmp_path / 'run'}\n"
    )
    monkeypatch.chdir(ROOT)  # not the config's folder
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["train", str(config)]) == 0  # as a user runs it: the parsed config keeps its folder
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["iterations"] == 22
    saved = tmp_path / "run" / "config.yaml"
    assert saved.read_text().splitlines()[0] == f"# ember: model modules are also looked for in {tmp_path}"
    # killed before its summary was written, resumed from the run folder in a fresh interpreter's state: the
    # trainer is built again, its module found beside the original config
    (tmp_path / "run" / "summary.json").unlink()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    monkeypatch.delitem(sys.modules, "mymodels")
    assert main(["resume", str(tmp_path / "run")]) == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["iterations"] == 22
    assert saved.read_text().splitlines()[0] == f"# ember: model modules are also looked for in {tmp_path}"


def test_a_run_that_cannot_be_built_leaves_no_run_folder(tmp_path, monkeypatch, capsys):
    """A model module that is not there: one line, status 2, and no run folder (nor its config.yaml) left behind."""
    config = tmp_path / "run.yaml"
    config.write_text(f"model:\n  name: 'nosuchmodels:Net'\noutput: {tmp_path / 'run'}\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert err == "ember: error: model.name: cannot import 'nosuchmodels:Net' (No module named 'nosuchmodels').\n"
    assert not (tmp_path / "run").exists()


def test_labels_past_the_models_classes_are_refused_before_training(tmp_path, capsys):
    """y.npy with 20 classes and the built-in mlp (10 outputs) trained to NaN; now: one line naming the fix."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(100, 8, 8, 1)).astype(np.float32))
    np.save(tmp_path / "y.npy", np.arange(100, dtype=np.int32) % 20)
    args = ["train", f"data.path={tmp_path}", "data.name=npy", "model.name=mlp", f"--output={tmp_path / 'run'}"]
    assert main(args) == 2
    assert capsys.readouterr().err == (
        "ember: error: data: the labels go up to 19 (in y.npy), but the model 'mlp' outputs 10 classes (labels 0 to "
        "9); set model.args.num_classes=20, or check the labels.\n"
    )
    assert not (tmp_path / "run").exists()
    assert main([*args, "model.args={num_classes: 20}", "trainer.max_epochs=1", "handlers.progress=false"]) == 0


def test_inspect_reads_a_run_folder_as_a_run(default_run, capsys):
    """`ember inspect RUN` and `ember inspect RUN/checkpoints` show the latest and the best checkpoint, no warning."""
    for target in (default_run, default_run / "checkpoints"):
        assert main(["inspect", str(target)]) == 0
        out = capsys.readouterr()
        sections = re.findall(r"^(\S+):$", out.out, flags=re.M)
        assert sections == [str(default_run / "checkpoints" / "best"), str(default_run / "checkpoints" / "latest")]
        assert re.search(r"^checkpoint step_\d{8}-val_accuracy=0\.9\d{3}$", out.out, flags=re.M)
        assert out.err == ""


def test_plot_gives_each_unit_an_axis_of_its_own(default_run):
    """What `ember train` logs: the two losses share an axis; the accuracy and the learning rate each have their own."""
    from ember.cli._plot import panels

    logged = {k for line in (default_run / "metrics.jsonl").read_text().splitlines() for k in json.loads(line)}
    assert panels(logged - {"step", "time", "hparams", "metrics"}) == {  # less the hyperparameters record
        "loss": ["train/loss", "val/loss"],
        "learning rate": ["train/lr"],
        "accuracy": ["val/accuracy"],
    }


PLACEMENTS = {
    "auto": "placement: auto",
    "pmap": "placement: pmap",
    "fsdp": "placement: fsdp",
    "sharded": "placement: sharded\n  mesh: {fsdp: 4, model: 2}\n  rules: [['Dense_0\\.kernel', fsdp, model]]",
}


@pytest.mark.parametrize(
    ("devices", "placement"), [(2, "auto"), (8, "auto"), (1, "pmap"), (2, "pmap"), (8, "fsdp"), (8, "sharded")]
)
def test_the_main_job_runs_unchanged_on_any_number_of_devices(tmp_path, devices, placement):
    """The main job on 1 to 8 devices, with every placement.

    The validation set's batch of 359 is padded and masked on 2 and 8 devices; pmap works on 1 and 2; the
    state shards with ``fsdp`` and on a ``sharded`` 4 x 2 mesh with a tensor-parallel rule.
    """
    config = tmp_path / "run.yaml"
    config.write_text(
        f"trainer:\n  max_epochs: 1\n  {PLACEMENTS[placement]}\nhandlers:\n  progress: false\n"
        f"output: {tmp_path / 'run'}\n"
    )
    env = {**os.environ, "XLA_FLAGS": xla_devices(devices), "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-W", "error", "-m", "ember.cli", "train", str(config)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["iterations"], summary["best_accuracy"] > 0.5) == (22, True)
    plural = "s" if devices > 1 else ""
    assert re.fullmatch(  # what it runs on, first
        rf"Training on cpu: {devices} device{plural}, placement \w+( \(auto\))?, precision float32\.",
        result.stdout.splitlines()[0],
    ), result.stdout
    if placement in ("fsdp", "sharded"):  # the layout, once, before the first epoch's line
        lines = result.stdout.splitlines()
        head = lines.index(next(line for line in lines if line.startswith("array ")))
        assert lines[head - 1].startswith("Sharded: mesh")
        spec = "P('fsdp', None)" if placement == "fsdp" else "P('fsdp', 'model')"
        row = next(line for line in lines if line.startswith("params.Dense_0.kernel "))
        assert re.split(r"\s{2,}", row) == ["params.Dense_0.kernel", "(512, 64)", spec, "16,384"]
        assert sum(line.startswith("array ") for line in lines) == 1


def test_sharded_placement_config_errors_name_the_field():
    """A mesh whose sizes do not multiply to the devices, a mesh without ``sharded``, a malformed rule."""
    from ember.cli import load_config
    from ember.cli._registry import build_placement

    def error(trainer):
        with pytest.raises(ConfigError) as info:
            build_placement(load_config({"trainer": trainer}).trainer)
        return str(info.value)

    assert error({"placement": "sharded", "mesh": {"fsdp": 2, "model": 4}}) == (
        "trainer.mesh: the sizes {'fsdp': 2, 'model': 4} multiply to 8, but there are 1 devices."
    )
    assert error({"placement": "fsdp", "mesh": {"fsdp": 1}}) == (
        "trainer.mesh: only placement 'sharded' takes a mesh; placement is 'fsdp'."
    )
    assert error({"placement": "sharded", "mesh": {"fsdp": 0}}) == (
        "trainer.mesh: expected axis names with positive int sizes, got {'fsdp': 0}."
    )
    assert error({"placement": "fsdp", "rules": [["kernel"]]}) == (
        "trainer.rules[0]: expected [regex, axis or null, ...], got ['kernel']."
    )


def test_the_digits_are_scikit_learns_read_without_importing_it(tmp_path, monkeypatch):
    """The default data: load_digits' very arrays, from its shipped file (no scikit-learn import), else load_digits."""
    import importlib.util

    from sklearn.datasets import load_digits

    from ember.cli import _registry

    expected = load_digits()
    monkeypatch.delitem(sys.modules, "sklearn.datasets")  # a fresh process has it not; this read must not bring it
    images, target = _registry.digits_arrays()
    assert "sklearn.datasets" not in sys.modules
    assert images.shape == (1797, 8, 8)
    np.testing.assert_array_equal(images, expected.images)
    np.testing.assert_array_equal(target, expected.target)
    assert target.dtype == expected.target.dtype
    elsewhere = importlib.util.spec_from_file_location("sklearn", tmp_path / "sklearn" / "__init__.py")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: elsewhere)  # a scikit-learn without the file
    images, target = _registry.digits_arrays()
    np.testing.assert_array_equal(images, expected.images)
    np.testing.assert_array_equal(target, expected.target)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # no scikit-learn at all
    with pytest.raises(ImportError, match=r"^The digits data set needs scikit-learn, which ember's `cli` extra"):
        _registry.digits_arrays()


def test_your_own_data_from_a_folder_of_npy_files_and_from_a_grain_function(tmp_path, monkeypatch):
    """data.name npy reads x.npy/y.npy from disk; data.name grain imports package.module:function; both train."""
    from ember.cli._registry import load_data

    arrays, _ = load_data(load_config({}).data)  # the digits, as a user's own arrays on disk
    folder = tmp_path / "digits_npy"
    folder.mkdir()
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", array)
    base = {"trainer": {"max_epochs": 2}, "handlers": {"progress": False}}
    npy = train(
        {**base, "data": {"name": "npy", "path": str(folder), "batch_size": 64}, "output": str(tmp_path / "npy")},
        stream=io.StringIO(),
    )
    per_epoch = (len(arrays["y"]) - round(len(arrays["y"]) * 0.2)) // 64
    assert (npy["epochs"], npy["iterations"]) == (2, 2 * per_epoch)
    assert npy["best_accuracy"] > 0.5

    (tmp_path / "mydata.py").write_text(
        "import numpy as np\nfrom ember.data import GrainPipeline\n\n\n"
        "def make(batch_size, seed):\n"
        f"    x = np.load({str(folder / 'x.npy')!r})\n    y = np.load({str(folder / 'y.npy')!r})\n"
        "    records = [{'x': a, 'y': b} for a, b in zip(x, y)]\n"
        "    return GrainPipeline(records[200:], batch_size=batch_size, shuffle=True, seed=seed), "
        "[{'x': x[:200], 'y': y[:200]}]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    own = train(
        {**base, "data": {"name": "grain", "path": "mydata:make", "batch_size": 32}, "output": str(tmp_path / "own")},
        stream=io.StringIO(),
    )
    assert (own["epochs"], own["iterations"]) == (2, 2 * ((len(arrays["y"]) - 200) // 32))
    with pytest.raises(ConfigError, match=re.escape("data.path: data 'npy' needs a path, and none was given.")):
        train({**base, "data": {"name": "npy"}, "output": str(tmp_path / "bad")}, stream=io.StringIO())
    with pytest.raises(ConfigError, match=re.escape("data.path: expected 'package.module:function', got 'nowhere:f'")):
        train({**base, "data": {"name": "grain", "path": "nowhere:f"}, "output": str(tmp_path / "bad2")})


def test_lr_find_runs_the_range_test_on_a_config_and_plots_it(tmp_path, capsys):
    png = tmp_path / "lr.png"
    args = ["lr-find", "model.name=mlp", "--start", "1e-4", "--end", "1", "--num-iter", "20", "--output", str(png)]
    assert main(args) == 0
    line, curve, rerun = capsys.readouterr().out.strip().splitlines()[-3:]
    assert re.fullmatch(r"suggested learning rate: [\d.e-]+ \(\d+ steps tried\)", line), line
    suggested = line.split()[3]
    assert 1e-4 <= float(suggested) <= 1.0
    assert curve == f"the curve: {png}"
    assert rerun == f"to train with it: ember train model.name=mlp optimizer.learning_rate={suggested}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_line_takes_overrides_anywhere_and_names_its_mistakes(tmp_path, capsys, monkeypatch):
    """Overrides after --output; a key without a value; a model argument misspelt; wandb as a writer."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run = tmp_path / "run"
    args = ["train", "--output", str(run), "trainer.max_epochs=1", "handlers.progress=false"]
    assert main([*args, "handlers.writers=[jsonl, wandb]"]) == 0
    assert json.loads((run / "summary.json").read_text())["iterations"] == 22
    capsys.readouterr()
    assert main(["train", "trainer.max_epochs"]) == 2
    assert capsys.readouterr().err == (
        "ember: error: 'trainer.max_epochs' is not a config file; an override takes a value: "
        "trainer.max_epochs=VALUE (such as trainer.max_epochs=3).\n"
    )
    assert main(["train", f"--output={tmp_path / 'other'}", "model.name=mlp", "model.args={hiden: [8]}"]) == 2
    assert capsys.readouterr().err == (
        "ember: error: model.args.hiden: MLP takes no argument 'hiden'; did you mean 'hidden'? "
        "(it takes: hidden, num_classes)\n"
    )
    with pytest.raises(SystemExit):
        main(["train", "--outptu", str(run)])
    assert "unrecognized arguments: --outptu" in capsys.readouterr().err


def test_plot_draws_a_resumed_runs_overlap_once_with_the_resumed_values():
    """Steps logged by a stopped run and again by its resumed run: one point each, the resumed run's."""
    from ember.cli._plot import curves

    stopped = [{"step": s, "train/loss": 1.0 / s} for s in (10, 20, 30)]
    resumed = [{"step": s, "train/loss": 2.0 / s} for s in (30, 40)] + [{"step": 40, "val/accuracy": 0.5}]
    lines = [json.dumps(row) for row in stopped + resumed]
    assert curves(lines) == {
        "train/loss": [(10, 0.1), (20, 0.05), (30, 2.0 / 30), (40, 0.05)],
        "val/accuracy": [(40, 0.5)],
    }


def test_an_error_deep_in_the_model_is_one_line_naming_the_data_and_debug_shows_the_traceback(tmp_path, capsys):
    """2-D data into the built-in CNN: what the model takes and what the data is; --debug raises it whole."""
    np.save(tmp_path / "x.npy", np.zeros((100, 2), np.float32))
    np.save(tmp_path / "y.npy", np.zeros(100, np.int32))
    args = ["train", "data.name=npy", f"data.path={tmp_path}", f"--output={tmp_path / 'run'}"]
    assert main(args) == 2
    assert capsys.readouterr().err == (
        "ember: error: model 'cnn' cannot take the data's inputs: one batch of x is float32[1, 2] (ValueError: "
        "operands could not be broadcast together with shapes (0,) (2,)). The built-in cnn takes images, (batch, "
        "height, width, channels), such as the digits' (batch, 8, 8, 1); model.name=mlp takes inputs of any shape. "
        "Run with --debug for the traceback.\n"
    )
    with pytest.raises(ConfigError, match=r"^model 'cnn' cannot take the data's inputs") as info:
        main([*args, "--debug"])
    assert isinstance(info.value.__cause__, ValueError)
    assert not (tmp_path / "run").exists()


def test_a_relaunch_may_change_the_placement_and_says_it_restored_onto_a_new_layout(tmp_path, capsys):
    """Stopped after epoch 1 of 2 (its last checkpoint removed), relaunched data_parallel: it resumes, says so."""
    config = {
        "trainer": {"max_epochs": 2, "placement": "single"},
        "handlers": {"progress": False, "writers": ["jsonl"]},
        "output": str(tmp_path),
    }
    assert train(config)["iterations"] == 44
    shutil.rmtree(tmp_path / "checkpoints" / "latest" / "step_00000044")  # as if stopped after the first epoch
    (tmp_path / "summary.json").unlink()
    capsys.readouterr()
    summary = train({**config, "trainer": {"max_epochs": 2, "placement": "data_parallel"}})
    out = capsys.readouterr().out
    assert f"Resuming {tmp_path} from step_00000022 (iteration 22).\n" in out
    assert "Restored onto a new layout (trainer.placement: 'single' -> 'data_parallel').\n" in out
    assert (summary["resumed_from"], summary["iterations"]) == (22, 44)
    with pytest.raises(ConfigError, match=r"optimizer\.learning_rate: 0\.003 -> 0\.01\)"):  # the math: refused
        train({**config, "optimizer": {"learning_rate": 0.01}})


def test_a_resumed_run_drops_the_logs_of_steps_past_its_checkpoint(tmp_path, capsys):
    """Stopped past its checkpoint (step 22 of 44): the relaunch logs steps 23-44 again, and each is logged once."""
    from tests.writers.tb_reader import read_events

    config = {
        "trainer": {"max_epochs": 2},
        "handlers": {"progress": False, "writers": ["jsonl", "csv", "tensorboard"], "log_every": 10, "histograms": 20},
        "output": str(tmp_path),
    }
    assert train(config)["iterations"] == 44
    shutil.rmtree(tmp_path / "checkpoints" / "latest" / "step_00000044")  # the run died after logging them
    (tmp_path / "summary.json").unlink()
    assert train(config)["resumed_from"] == 22
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    hparams = [row for row in rows if "hparams" in row]  # the first run's, at step 44, dropped with its steps
    assert [(r["step"], r["hparams"]["trainer.max_epochs"], r["hparams"]["handlers.histograms"]) for r in hparams] == [
        (44, 2, 20)
    ]
    assert hparams[0]["metrics"] == {k: rows[-2][k] for k in ("val/accuracy", "val/loss")}  # the last evaluation's
    rows = [row for row in rows if "hparams" not in row]
    logged = sorted((name, row["step"]) for row in rows for name in row if name not in ("step", "time"))
    assert logged == sorted(
        [("train/loss", s) for s in (10, 20, 30, 40)]
        + [("train/lr", s) for s in (10, 20, 30, 40)]
        + [(f"val/{m}", s) for m in ("accuracy", "loss") for s in (22, 44)]
    )
    csv_rows = (tmp_path / "metrics.csv").read_text().splitlines()
    assert csv_rows[0] == "step,name,value"
    assert len(csv_rows) - 1 == len(logged)
    events = read_events(tmp_path / "tb")
    starts = [e.step for e in events if e.HasField("session_log")]
    assert starts == [23]  # TensorBoard's purge mark: steps from 23 in the earlier file are dropped
    histograms = sorted((v.tag, e.step) for e in events for v in e.summary.value if v.HasField("histo"))
    layers = sorted({tag for tag, _ in histograms})
    assert layers == [
        f"weights/{layer}.{p}" for layer in ("Conv_0", "Conv_1", "Dense_0", "Dense_1") for p in ("bias", "kernel")
    ]
    assert histograms == sorted((tag, step) for tag in layers for step in (20, 40, 40))  # 40 again after the resume
    assert [e.step for e in events for v in e.summary.value if v.tag == "_hparams_/session_start_info"] == [44, 44]


def test_precision_and_remat_from_the_config(tmp_path, capsys):
    """trainer.precision and trainer.remat reach the trainer and the evaluator; the first line says the precision."""
    args = ["train", "trainer.max_epochs=1", "trainer.precision=bf16-mixed", "trainer.remat=full"]
    assert main([*args, "handlers.progress=false", "handlers.writers=[jsonl]", f"--output={tmp_path / 'run'}"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith("precision bfloat16 with float32 parameters.")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["iterations"] == 22
    assert summary["final_accuracy"] > 0.5


def test_16_mixed_from_the_config_logs_its_loss_scale(tmp_path, capsys):
    """trainer.precision=16-mixed: the run says so, and logs the scale and the skipped steps beside the loss."""
    args = ["train", "model.name=mlp", "trainer.max_epochs=1", "trainer.precision=16-mixed", "handlers.log_every=10"]
    assert main([*args, "handlers.progress=false", "handlers.writers=[jsonl]", f"--output={tmp_path / 'run'}"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith("precision float16 with float32 parameters and dynamic loss scaling.")
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [(r["step"], r["train/loss_scale"], r["train/skipped_steps"]) for r in logged if "train/loss" in r]
    assert train == [(10, 32768.0, 0.0), (20, 32768.0, 0.0)]


def test_skip_nonfinite_from_the_config_logs_the_skipped_steps(tmp_path, capsys):
    """trainer.skip_nonfinite and spike_factor reach the trainer; train/skipped_steps is logged beside the loss."""
    args = ["train", "model.name=mlp", "trainer.max_epochs=1", "trainer.skip_nonfinite=true", "trainer.spike_factor=50"]
    run = [*args, "handlers.log_every=10", "handlers.progress=false", "handlers.writers=[jsonl]"]
    assert main([*run, f"--output={tmp_path / 'run'}"]) == 0
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["train/skipped_steps"]) for r in logged if "train/loss" in r] == [(10, 0.0), (20, 0.0)]


def test_a_poisoned_window_is_skipped_and_rolled_back_in_ember_train(tmp_path, capsys):
    """Three NaN batches in a row with skip_nonfinite: skipped, then one rollback, said on the console.

    Iterations 16-18; the run completes its epoch.
    """
    (tmp_path / "poisoned.py").write_text(
        "import numpy as np\n"
        "from sklearn.datasets import load_digits\n\n\n"
        "def data(batch_size, seed):\n"
        "    x, y = load_digits(return_X_y=True)\n"
        "    x, y = (x / 16.0).astype(np.float32).reshape(-1, 8, 8, 1), y.astype(np.int32)\n"
        "    train = [{'x': x[i : i + 32], 'y': y[i : i + 32]} for i in range(0, 32 * 20, 32)]\n"
        "    for i in (15, 16, 17):\n"
        "        train[i] = {'x': np.full_like(train[i]['x'], np.nan), 'y': train[i]['y']}\n"
        "    return train, [{'x': x[1500:], 'y': y[1500:]}]\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text(f"data:\n  name: grain\n  path: poisoned:data\noutput: {tmp_path / 'run'}\n")
    args = [str(config), "model.name=mlp", "trainer.max_epochs=1", "trainer.skip_nonfinite=true"]
    assert main(["train", *args, "handlers.checkpoint.every_iters=5", "handlers.progress=false"]) == 0
    out = capsys.readouterr().out
    assert (
        "Rolled back to the checkpoint of iteration 15 after 3 skipped steps in a row (iterations 16-18, the last "
        "for a non-finite loss); the batches of iterations 16-19 are left out." in out.splitlines()
    )
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["iterations"], summary["stopped"]) == (20, None)
