"""``ember export``: a run's weights in a file read back without ember, equal to the checkpoint's, bit for bit."""

import errno
import os
import re
import sys

import numpy as np
import optax
import pytest
from flax import serialization

from ember.cli import MLP, load_config, main
from ember.cli._registry import build_data
from tests.cli.test_own_model import nnx_run
from tests.conftest import stored
from tests.subprocesses import run_python


def test_msgpack_holds_the_checkpoints_parameters_and_a_linen_apply_gets_the_runs_accuracy(mlp_run, tmp_path, capsys):
    """Read back with flax.serialization alone; the MLP's predictions on the validation set score as `ember eval`."""
    out = tmp_path / "weights.msgpack"
    assert main(["export", str(mlp_run), str(out)]) == 0
    saved, info = stored(mlp_run)
    assert capsys.readouterr().out == f"step_00000022 (iteration 22): 4 arrays, 9,610 values -> {out}\n"
    weights = serialization.msgpack_restore(out.read_bytes())
    assert sorted(weights) == ["params"]
    assert sorted(weights["params"]) == ["Dense_0", "Dense_1"]
    for layer in ("Dense_0", "Dense_1"):
        for leaf in ("kernel", "bias"):
            np.testing.assert_array_equal(weights["params"][layer][leaf], saved[f"params.{layer}.{leaf}"])
    _, val, _ = build_data(load_config({}).data)
    batch = next(iter(val))
    logits = MLP().apply({"params": weights["params"]}, batch["x"])
    accuracy = float(np.mean(np.argmax(logits, -1) == batch["y"]))
    assert main(["eval", str(mlp_run)]) == 0
    assert f"val/accuracy {accuracy:.4f}" in capsys.readouterr().out
    assert info.step == 22


def test_safetensors_of_the_best_checkpoint_with_the_model_state(mlp_run, tmp_path, capsys):
    """--checkpoint best --take model: flat keys named as ember inspect names them, each the stored array."""
    from safetensors.numpy import load_file

    out = tmp_path / "best.safetensors"
    assert main(["export", str(mlp_run), str(out), "--checkpoint", "best", "--take", "model"]) == 0
    saved, info = stored(mlp_run, "best")
    assert capsys.readouterr().out == f"{info.path.name} (iteration 22): 4 arrays, 9,610 values -> {out}\n"
    weights = load_file(out)
    assert sorted(weights) == sorted(k for k in saved if k.startswith("params."))  # an MLP has no model state
    for name, array in weights.items():
        np.testing.assert_array_equal(array, saved[name])


def test_an_nnx_runs_parameters_and_state_as_plain_nested_names(tmp_path, monkeypatch, capsys):
    """An NNX module's weights: no ``.value`` in the names; its batch statistics and RNG key (as key data) too."""
    from safetensors.numpy import load_file

    nnx_run(tmp_path, monkeypatch)
    out = tmp_path / "w.safetensors"
    assert main(["export", str(tmp_path / "run"), str(out), "--take", "model"]) == 0
    # 4,290 parameters; 19 values of state: 8 means, 8 variances, the stream's count and its key's 2 words
    assert capsys.readouterr().out.splitlines()[-1] == f"step_00000003 (iteration 3): 12 arrays, 4,309 values -> {out}"
    weights = load_file(out)
    assert sorted(weights) == [
        "model_state.bn.mean",
        "model_state.bn.var",
        "model_state.dropout.rngs.count",
        "model_state.dropout.rngs.key",
        "params.bn.bias",
        "params.bn.scale",
        "params.conv.bias",
        "params.conv.kernel",
        "params.dense.bias",
        "params.dense.kernel",
        "params.out.bias",
        "params.out.kernel",
    ]
    saved, _ = stored(tmp_path / "run")
    np.testing.assert_array_equal(weights["params.dense.kernel"], saved["params.dense.kernel.value"])
    np.testing.assert_array_equal(weights["model_state.bn.mean"], saved["model_state.bn.mean.value"])
    assert weights["model_state.dropout.rngs.key"].dtype == np.uint32  # a key's data: no NumPy form of a key
    sys.modules.pop("mymodels", None)


def test_an_existing_file_is_replaced_whole_and_a_full_disk_leaves_it_as_it_was(mlp_run, tmp_path, monkeypatch):
    """ENOSPC at the fsync: the OSError, the old file untouched, no temporary file beside it."""
    import ember._atomic_file as atomic
    from ember.cli._checkpoint_contents import export_weights

    out = tmp_path / "weights.msgpack"
    out.write_bytes(b"old")
    export_weights(mlp_run, out)
    first = out.read_bytes()
    assert serialization.msgpack_restore(first)["params"]["Dense_0"]["bias"].shape == (128,)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(OSError, match=r"^\[Errno 28\] No space left on device$"):
        export_weights(mlp_run, out, checkpoint="best")
    monkeypatch.undo()
    assert out.read_bytes() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights.msgpack"]


def test_the_command_in_a_fresh_process_writes_a_relative_output_where_it_runs(mlp_run, tmp_path):
    """``ember export RUN w.msgpack`` as a user runs it, from another folder: the file lands there."""
    done = run_python(["-m", "ember.cli", "export", str(mlp_run), "w.msgpack"], cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "step_00000022 (iteration 22): 4 arrays, 9,610 values -> w.msgpack\n"
    weights = serialization.msgpack_restore((tmp_path / "w.msgpack").read_bytes())
    np.testing.assert_array_equal(weights["params"]["Dense_1"]["bias"], stored(mlp_run)[0]["params.Dense_1.bias"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["{out}.txt"],
            "OUTPUT must end in .msgpack or .safetensors, or --format orbax name a folder; got '{out}.txt'.",
        ),
        (["{out}/missing/w.msgpack"], "OUTPUT's folder {out}/missing does not exist."),
        (["{folder}.msgpack"], "OUTPUT {folder}.msgpack is a folder; name the file to write."),
        (["{out}.msgpack", "--checkpoint", "7"], "{run} holds no checkpoint of step 7; it holds steps [22]."),
        (
            ["{out}.msgpack", "--checkpoint", "newest"],
            "`--checkpoint` must be latest, best or a step (an int), got 'newest'.",
        ),
        (
            ["{out}.msgpack", "trainer"],
            "ember export takes RUN_DIR OUTPUT then KEY=VALUE overrides; 'trainer' is not one.",
        ),
    ],
)
def test_what_cannot_be_exported_is_refused_in_one_line(mlp_run, tmp_path, capsys, args, message):
    (tmp_path / "f.msgpack").mkdir()
    fill = {"out": tmp_path / "w", "folder": tmp_path / "f", "run": mlp_run}
    assert main(["export", str(mlp_run), *(a.format(**fill) for a in args)]) == 2
    assert capsys.readouterr().err == f"ember: error: {message.format(**fill)}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.msgpack"]


def test_a_run_folder_without_checkpoints_and_a_take_of_another_name(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("model:\n  name: mlp\n")
    assert main(["export", str(tmp_path), str(tmp_path / "w.msgpack")]) == 2
    latest = tmp_path / "checkpoints" / "latest"
    assert capsys.readouterr().err == f"ember: error: {latest} holds no valid checkpoint.\n"
    with pytest.raises(SystemExit):
        main(["export", str(tmp_path), "w.msgpack", "--take", "everything"])
    assert re.search(
        r"argument --take: invalid choice: 'everything' \(choose from '?params'?, '?model'?\)", capsys.readouterr().err
    )


def test_safetensors_without_its_package_names_the_extra(mlp_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    assert main(["export", str(mlp_run), str(tmp_path / "w.safetensors")]) == 2
    assert capsys.readouterr().err == (
        "ember: error: ember export to .safetensors needs safetensors, which ember's `export` extra brings: pip "
        'install -e ".[export]" in your clone of ember (ember is not on PyPI).\n'
    )
    assert list(tmp_path.iterdir()) == []


def test_overrides_change_the_model_built_and_a_checkpoint_that_does_not_fit_it_is_refused(mlp_run, tmp_path, capsys):
    """KEY=VALUE after OUTPUT changes the run's config (here the MLP's width): the restore names every difference."""
    assert main(["export", str(mlp_run), str(tmp_path / "w.msgpack"), "model.args={hidden: [64]}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ember: error: The checkpoint does not fit the target (9 differences):\n"), err
    assert "  trainer/params.Dense_0.kernel: the checkpoint has float32[64, 128], the target float32[64, 64]\n" in err
    assert list(tmp_path.iterdir()) == []


def test_an_orbax_export_is_read_back_by_orbax_alone_and_starts_another_run(mlp_run, tmp_path, capsys):
    """--format orbax: an Orbax checkpoint folder of {"params": ...}; init_from takes it as it takes the run."""
    import orbax.checkpoint as ocp

    from ember.checkpoint import init_from
    from ember.training import TrainState

    out = tmp_path / "weights"
    assert main(["export", str(mlp_run), str(out), "--format", "orbax"]) == 0
    assert capsys.readouterr().out == f"step_00000022 (iteration 22): 4 arrays, 9,610 values -> {out}\n"
    saved, _ = stored(mlp_run)
    with ocp.StandardCheckpointer() as checkpointer:
        weights = checkpointer.restore(out)
    for layer in ("Dense_0", "Dense_1"):
        np.testing.assert_array_equal(weights["params"][layer]["kernel"], saved[f"params.{layer}.kernel"])
    state, report = init_from(TrainState.from_linen(MLP(), np.zeros((1, 8, 8, 1), np.float32), optax.sgd(0.1)), out)
    assert (report.source, len(report.loaded), report.fresh, report.unused) == (str(out), 4, {}, [])
    np.testing.assert_array_equal(np.asarray(state.params["Dense_1"]["bias"]), saved["params.Dense_1.bias"])
    assert main(["export", str(mlp_run), str(out), "--format", "orbax"]) == 2  # never over a folder that exists
    assert capsys.readouterr().err == (
        f"ember: error: OUTPUT {out} exists; an Orbax export writes a new folder: name another.\n"
    )


KILLED_EXPORT = """
import sys, time
import ember._atomic_file as atomic

def paused(fd):  # the whole file written, not yet made durable nor renamed: where a SIGKILL hurts most
    open(sys.argv[3], "w").close()
    time.sleep(120)

atomic.os.fsync = paused
from ember.cli import main
main(["export", sys.argv[1], sys.argv[2]])
"""


def test_a_sigkill_during_the_write_leaves_the_old_file_and_the_next_export_clears_what_it_left(mlp_run, tmp_path):
    """A SIGKILL between the write and the rename: the earlier export stays whole; its temporary goes at the next."""
    import signal
    import subprocess
    import time

    from ember.cli._checkpoint_contents import export_weights
    from tests.subprocesses import PYTHONPATH, end_group

    out, marker = tmp_path / "w.msgpack", tmp_path / "writing"
    export_weights(mlp_run, out, checkpoint="best")
    before = out.read_bytes()
    args = [sys.executable, "-c", KILLED_EXPORT, str(mlp_run), str(out), str(marker)]
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    with subprocess.Popen(args, env=env, start_new_session=True, stderr=subprocess.PIPE) as proc:
        try:
            deadline = time.monotonic() + 180
            while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert marker.exists(), proc.stderr.read() if proc.poll() is not None else "no write within 180 s"
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL
        finally:
            end_group(proc.pid)
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-w.msgpack-"))
    assert len(left) == 1, sorted(p.name for p in tmp_path.iterdir())
    assert out.read_bytes() == before
    export_weights(mlp_run, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.msgpack", "writing"]
    assert serialization.msgpack_restore(out.read_bytes())["params"]["Dense_1"]["bias"].shape == (10,)


def test_a_run_keeping_a_moving_average_is_judged_by_it_and_exports_it(mlp_run, tmp_path, capsys):
    """optimizer.ema: the validations score the average; --ema writes it, which scores as ember eval says."""
    from ember.cli._config import ConfigError

    run = tmp_path / "run"
    args = ["model.name=mlp", "optimizer.ema=0.2", "trainer.max_epochs=1", "handlers.progress=false"]
    assert main(["train", *args, f"--output={run}"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    said = capsys.readouterr().out.splitlines()[-1]
    for ema in (True, False):
        out = tmp_path / f"{ema}.msgpack"
        assert main(["export", str(run), str(out), *(["--ema"] if ema else [])]) == 0
        weights = serialization.msgpack_restore(out.read_bytes())["params"]
        _, val, _ = build_data(load_config({}).data)
        batch = next(iter(val))
        accuracy = float(np.mean(np.argmax(MLP().apply({"params": weights}, batch["x"]), -1) == batch["y"]))
        assert (f"val/accuracy {accuracy:.4f}" in said) == ema, (said, accuracy)  # the average, not the last step's
    saved, _ = stored(run)
    exported = serialization.msgpack_restore((tmp_path / "True.msgpack").read_bytes())["params"]
    np.testing.assert_array_equal(exported["Dense_0"]["kernel"], saved["opt_state.ema.Dense_0.kernel"])
    capsys.readouterr()
    assert main(["export", str(mlp_run), str(tmp_path / "w.msgpack"), "--ema"]) == 2
    assert capsys.readouterr().err == (
        f"ember: error: `--ema`: {mlp_run} keeps no moving average of its parameters (its optimizer.ema is null).\n"
    )
    with pytest.raises(ConfigError, match=re.escape("optimizer.ema: expected a number in (0, 1) (or null for none)")):
        load_config({"optimizer": {"ema": 1.5}})


def test_format_names_the_format_of_a_file_whatever_its_extension(mlp_run, tmp_path, capsys):
    """--format safetensors into ``weights.bin``: a safetensors file of the checkpoint's parameters."""
    from safetensors.numpy import load_file

    out = tmp_path / "weights.bin"
    assert main(["export", str(mlp_run), str(out), "--format", "safetensors"]) == 0
    assert capsys.readouterr().out == f"step_00000022 (iteration 22): 4 arrays, 9,610 values -> {out}\n"
    np.testing.assert_array_equal(load_file(out)["params.Dense_0.kernel"], stored(mlp_run)[0]["params.Dense_0.kernel"])
