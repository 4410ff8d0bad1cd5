"""The ``ember`` command end to end: the embedded digits run, resume, inspect, plot, errors."""

import json
import re

import pytest

from ember import __version__
from ember.cli import main, train


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """``ember train`` with no config (the embedded run) in a temporary run folder."""
    run = tmp_path_factory.mktemp("digits")
    assert main(["train", "--output", str(run)]) == 0
    return run


def test_the_default_run_reaches_97_percent_under_a_minute(default_run, capsys):
    summary = json.loads((default_run / "summary.json").read_text())
    assert summary["best_accuracy"] >= 0.97
    assert summary["seconds"] < 60
    assert summary["resumed_from"] is None
    assert sorted(p.name for p in default_run.iterdir()) == [
        "checkpoints",
        "config.yaml",
        "metrics.jsonl",
        "summary.json",
        "tb",
    ]
    assert len(list((default_run / "checkpoints" / "best").iterdir())) == 1
    assert len(list((default_run / "checkpoints" / "latest").iterdir())) == 2
    rows = [json.loads(line) for line in (default_run / "metrics.jsonl").read_text().splitlines()]
    assert {"train/loss", "train/lr", "val/accuracy", "val/loss"} <= {k for r in rows for k in r}


def test_running_the_same_command_again_resumes_and_finds_nothing_left(default_run, capsys):
    capsys.readouterr()
    assert main(["train", "--output", str(default_run)]) == 0
    out = capsys.readouterr().out
    assert "Resuming" in out
    assert f"{default_run}: this run is already complete; nothing to do." in out


def test_a_stopped_run_continues_where_it_stopped(tmp_path, capsys):
    config = {"trainer": {"max_epochs": 2}, "handlers": {"progress": False}, "output": str(tmp_path)}
    first = train(config)
    assert (first["epochs"], first["iterations"]) == (2, 44)
    config["trainer"]["max_epochs"] = 3
    second = train(config)
    assert (second["resumed_from"], second["epochs"], second["iterations"]) == (44, 3, 66)
    assert main(["resume", str(tmp_path)]) == 0  # the saved config now says 3 epochs: complete
    assert "already complete" in capsys.readouterr().out


def test_inspect_and_plot(default_run, capsys):
    assert main(["inspect", str(default_run / "checkpoints" / "best")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^checkpoint step_\d{8}-val_accuracy=0\.9\d{3}$", out, flags=re.M)
    assert re.search(r"^    trainer/params\.Dense_1\.kernel +float32\[64, 10\]$", out, flags=re.M)
    assert "early_stopping: {'counter': " in out
    assert main(["plot", str(default_run)]) == 0
    png = default_run / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_errors_are_one_line_with_exit_status_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_epoch: 3\n")
    assert main(["train", str(bad)]) == 2
    assert capsys.readouterr().err == (
        "ember: error: trainer.max_epoch: unknown field; did you mean 'max_epochs'? "
        "(allowed: eval_every, max_epochs, max_iters, placement, seed, steps_per_call)\n"
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

    from ember.cli._main import start_distributed

    with mock.patch("jax.distributed.initialize") as init:
        assert start_distributed({}) == {}
        init.assert_called_once_with()
    with pytest.raises(ValueError, match=re.escape("--distributed got ['EMBER_COORDINATOR'] from the environment")):
        start_distributed({"EMBER_COORDINATOR": "h:1"})
    with pytest.raises(ValueError, match=re.escape("EMBER_NUM_PROCESSES and EMBER_PROCESS_ID must be ints")):
        start_distributed({"EMBER_COORDINATOR": "h:1", "EMBER_NUM_PROCESSES": "two", "EMBER_PROCESS_ID": "0"})
