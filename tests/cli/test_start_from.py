"""``init:`` in ``ember train``: a new run started from another's weights, once; its relaunches resume their own."""

import json
import shutil

import numpy as np
import pytest

from ember.cli import ConfigError, load_config, main
from tests.conftest import stored

#: SGD at a learning rate too small to move anything in two steps: the weights checked are those the run began with.
STILL = [
    "model.name=mlp",
    "optimizer.name=sgd",
    "optimizer.learning_rate=1e-12",
    "optimizer.schedule=constant",
    "optimizer.clip_norm=null",
    "optimizer.momentum=0.0",
    "trainer.max_iters=2",
    "handlers.progress=false",
]


def test_a_run_starts_from_anothers_body_with_a_fresh_head_and_says_so_once(mlp_run, tmp_path, capsys):
    source = tmp_path / "source"
    shutil.copytree(mlp_run, source)
    run = tmp_path / "tuned"
    init = [f"init.source={source}", "init.fresh=[params.Dense_1]"]
    assert main(["train", *STILL, *init, f"--output={run}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    taken = source / "checkpoints" / "latest" / "step_00000022"
    assert lines[1:6] == [
        f"Started from {taken}: 2 loaded, 2 left fresh, 7 not taken, 2 unused in the source",
        "  left fresh: params.Dense_1.bias (fresh: params.Dense_1)",
        "  left fresh: params.Dense_1.kernel (fresh: params.Dense_1)",
        "  unused: params.Dense_1.bias",
        "  unused: params.Dense_1.kernel",
    ]
    record = json.loads((run / "init.json").read_text())
    assert record == {
        "source": str(taken),
        "loaded": ["params.Dense_0.bias", "params.Dense_0.kernel"],
        "fresh": {"params.Dense_1.bias": "fresh: params.Dense_1", "params.Dense_1.kernel": "fresh: params.Dense_1"},
        "not_taken": [
            "step",
            *(f"opt_state.0.trace.Dense_{i}.{p}" for i in (0, 1) for p in ("bias", "kernel")),
            "opt_state.1.count",
            "rng",
        ],  # SGD's own state, left fresh
        "unused": ["params.Dense_1.bias", "params.Dense_1.kernel"],
    }
    assert main(["train", *STILL, f"--output={tmp_path / 'scratch'}"]) == 0  # the same run without init:
    capsys.readouterr()
    tuned, _ = stored(run)
    scratch, _ = stored(tmp_path / "scratch")
    before, _ = stored(source)
    np.testing.assert_allclose(tuned["params.Dense_0.kernel"], before["params.Dense_0.kernel"], atol=1e-6)
    assert not np.allclose(scratch["params.Dense_0.kernel"], before["params.Dense_0.kernel"], atol=1e-3)
    np.testing.assert_allclose(tuned["params.Dense_1.kernel"], scratch["params.Dense_1.kernel"], atol=1e-6)

    # the source goes away, and the run is relaunched as after a kill before its end (its summary not yet written):
    # it resumes from its own checkpoint and never reads the source again
    shutil.rmtree(source)
    (run / "summary.json").unlink()
    assert main(["resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"Resuming {run} from step_00000002 (iteration 2)." in out.splitlines()
    assert "Started from" not in out
    assert json.loads((run / "init.json").read_text()) == record


def test_a_source_that_does_not_fit_is_refused_before_the_run_folder_is_made(mlp_run, tmp_path, capsys):
    """A narrower body than the source's, not left fresh: one error naming both shapes; no run folder."""
    run = tmp_path / "tuned"
    args = ["train", *STILL, "model.args={hidden: [64]}", f"init.source={mlp_run}", f"--output={run}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ember: error: {mlp_run / 'checkpoints' / 'latest' / 'step_00000022'} does not fit"), err
    assert "  params.Dense_1.kernel: the source has float32[128, 10], the target float32[64, 10]\n" in err
    assert not run.exists()
    assert main(["train", *STILL, f"init.source={tmp_path / 'gone'}", f"--output={run}"]) == 2
    assert capsys.readouterr().err == (
        f"ember: error: `source` {tmp_path / 'gone'} is neither a .msgpack or .safetensors file nor a folder of "
        "checkpoints or a run.\n"
    )
    assert not run.exists()


def test_init_options_with_other_values_and_the_checks_of_the_section(mlp_run, tmp_path, capsys):
    """take=params_and_opt_state with the source's own optimizer, checkpoint=best, strict, rename; and refusals."""
    run = tmp_path / "again"
    init = [f"init.source={mlp_run}", "init.take=params_and_opt_state", "init.checkpoint=best", "init.strict=false"]
    rename = ["init.rename={'^params[.]Dense_0[.]': 'params.Dense_0.'}"]
    assert main(["train", "model.name=mlp", "trainer.max_iters=1", "handlers.progress=false", *init, *rename,
                 f"--output={run}"]) == 0  # fmt: skip
    record = json.loads((run / "init.json").read_text())
    assert record["source"].startswith(str(mlp_run / "checkpoints" / "best" / "step_00000022-val_accuracy="))
    assert record["fresh"] == {}
    assert record["not_taken"] == ["step", "rng"]
    moments = [f"opt_state.1.0.{m}.Dense_{i}.{p}" for m in ("mu", "nu") for i in (0, 1) for p in ("bias", "kernel")]
    params = [f"params.Dense_{i}.{p}" for i in (0, 1) for p in ("bias", "kernel")]
    assert record["loaded"] == [*params, "opt_state.1.0.count", *moments, "opt_state.1.2.count"]  # AdamW's, the rate's
    capsys.readouterr()
    with pytest.raises(ConfigError, match=r"^init\.source: expected the run, checkpoint or weights file to start"):
        load_config({"init": {"take": "params"}})
    with pytest.raises(ConfigError, match=r"^init\.checkpoint: expected one of 'latest', 'best' or an int, got 'x'\."):
        load_config({"init": {"source": "a", "checkpoint": "x"}})


def test_a_relaunch_whose_checkpoints_are_only_in_the_fast_tier_resumes_them_without_the_source(
    mlp_run, tmp_path, capsys
):
    """With ``fast_dir``, a launch killed before its first durable save left checkpoints in the fast tier only.

    Its relaunch resumes from them and never reads the source again (deleted here): the run folder's tier is empty.
    """
    source, run, fast = tmp_path / "source", tmp_path / "tuned", tmp_path / "shm"
    shutil.copytree(mlp_run, source)
    args = [*STILL, f"init.source={source}", f"handlers.checkpoint.fast_dir={fast}"]
    assert main(["train", *args, f"--output={run}"]) == 0
    assert "Started from" in capsys.readouterr().out
    for durable in (run / "checkpoints" / "latest").glob("step_*"):  # as if killed before it was copied there
        shutil.rmtree(durable)
    (run / "summary.json").unlink()
    shutil.rmtree(source)
    assert main(["resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"Resuming {run} from step_00000002 (iteration 2)." in out.splitlines(), out
    assert "Started from" not in out
