"""How ``ember train`` ends when it does not run to its last epoch: Ctrl-C, SIGTERM, early stopping, a NaN loss."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

from ember import Events
from ember._ledger_file import read_records
from ember.cli import train
from tests.subprocesses import PYTHONPATH, ROOT, ember_train_signalled

LONG_RUN = [
    "handlers.progress=false",
    "trainer.max_epochs=200",
    "handlers.early_stopping=null",
    "handlers.writers=[jsonl]",
]


def signalled_run(run_dir, sig, wait_for, *extra):
    """``ember train`` on a long run; ``sig`` once a line starting with ``wait_for`` is printed. (status, out, err)."""
    return ember_train_signalled(["--output", str(run_dir), *LONG_RUN, *extra], sig, wait_for)


def test_ctrl_c_saves_says_how_to_resume_and_exits_130_then_sigterm_does_the_same_on_the_resumed_run(tmp_path):
    run_dir = tmp_path / "run"
    status, out, err = signalled_run(run_dir, signal.SIGINT, "epoch   1 ")
    assert status == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    stopped = re.search(
        r"^Stopped at iteration (\d+) \(Ctrl-C\), the checkpoint saved; run the same command to "
        r"resume\. Best val accuracy 0\.\d{4}\. Run folder: ",
        out,
        re.M,
    )
    assert stopped, out
    iteration = int(stopped.group(1))
    assert 22 <= iteration < 200 * 22
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["stopped"], summary["stopped_early"], summary["iterations"]) == ("SIGINT", False, iteration)
    latest = sorted(p.name for p in (run_dir / "checkpoints" / "latest").iterdir())
    assert latest[-1] == f"step_{iteration:08d}"

    status, out, err = signalled_run(run_dir, signal.SIGTERM, "epoch ")  # the resumed run's first epoch
    assert status == 143, err[-3000:]
    assert f"Resuming {run_dir} from step_{iteration:08d} (iteration {iteration})." in out
    again = re.search(r"^Stopped at iteration (\d+) \(SIGTERM\), the checkpoint saved; run the same command", out, re.M)
    assert again, out
    assert int(again.group(1)) > iteration
    assert json.loads((run_dir / "summary.json").read_text())["stopped"] == "SIGTERM"
    first, second = read_records(run_dir)  # the goodput ledger: both runs; the stop saved, so nothing is trained again
    assert (first["last_iteration"], second["first_iteration"], second["lost_steps"]) == (iteration, iteration, 0)
    assert [first["ended"], second["ended"]] == ["completed", "completed"]


def test_a_run_ended_by_early_stopping_is_complete_for_the_same_command(tmp_path, capsys):
    """The improvement asked for (0.5) never comes: stopped after patience 2, announced; a relaunch does nothing."""
    config = {
        "trainer": {"max_epochs": 10},
        "handlers": {"progress": False, "early_stopping": {"patience": 2, "threshold": 0.5}, "writers": ["jsonl"]},
        "output": str(tmp_path),
    }
    first = train(config)
    assert (first["epochs"], first["stopped"], first["stopped_early"]) == (3, "early stopping", True)
    out = capsys.readouterr().out
    assert "Early stopping: val accuracy did not improve for 2 evaluations; stopped at epoch 3.\n" in out
    record = (tmp_path / "summary.json").read_text()
    again = train(config)
    out = capsys.readouterr().out
    assert f"{tmp_path}: this run is already complete; nothing to do." in out
    assert again == first
    assert (tmp_path / "summary.json").read_text() == record


def test_a_stalled_run_exits_75_with_its_stacks_in_the_run_folder_and_the_relaunch_resumes(tmp_path):
    """handlers.stall: the data hangs at batch 7 (once); the run ends with status 75, the relaunch finishes it."""
    (tmp_path / "hanging.py").write_text(
        "import os, time\n"
        "import numpy as np\n"
        "from sklearn.datasets import load_digits\n\n\n"
        "class Batches:\n"
        "    def __init__(self, x, y, marker):\n"
        "        self.x, self.y, self.marker = x, y, marker\n\n"
        "    def __len__(self):\n"
        "        return 10\n\n"
        "    def __iter__(self):\n"
        "        for i in range(10):\n"
        "            if i == 6 and not os.path.exists(self.marker):\n"
        "                open(self.marker, 'w').close()\n"
        "                time.sleep(120)  # a hang, once\n"
        "            yield {'x': self.x[i * 32 : (i + 1) * 32], 'y': self.y[i * 32 : (i + 1) * 32]}\n\n\n"
        "def data(batch_size, seed):\n"
        "    x, y = load_digits(return_X_y=True)\n"
        "    x, y = (x / 16.0).astype(np.float32).reshape(-1, 8, 8, 1), y.astype(np.int32)\n"
        f"    return Batches(x, y, {str(tmp_path / 'hung')!r}), [{{'x': x[1500:], 'y': y[1500:]}}]\n"
    )
    (tmp_path / "config.yaml").write_text(
        "data: {name: grain, path: 'hanging:data'}\n"
        "trainer: {max_epochs: 1}\n"
        "handlers: {progress: false, writers: [jsonl], checkpoint: {every_iters: 2},"
        " stall: {step_timeout: 2, startup_timeout: 120}}\n"
        f"output: {tmp_path / 'run'}\n"
    )
    command = [sys.executable, "-m", "ember.cli", "train", str(tmp_path / "config.yaml"), "model.name=mlp"]
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    first = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=100, check=False)
    assert first.returncode == 75, first.stderr[-3000:]
    assert (
        first.stdout.splitlines()[1] == "Watching: a stall watchdog (an iteration within 2 s, the first within 120 s)."
    )
    report = (tmp_path / "run" / "stall-process0.txt").read_text()
    assert report.startswith("ember: StallWatchdog: no iteration (step_timeout=2) completed in time. Process 0 of 1")
    assert re.search(r'File ".*hanging\.py", line \d+ in __iter__', report)
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=100, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"Resuming {tmp_path / 'run'} from step_00000006 (iteration 6)." in again.stdout
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["iterations"] == 10


def test_the_persistent_compilation_cache_is_on_and_a_second_run_shows_its_hits(tmp_path):
    """compilation_cache: auto is the user's cache folder: a run in a folder removed after it fills it, no warning.

    The second run's goodput record counts the first run's entries as hits, though each of its programs compiles in
    under JAX's default threshold for keeping one (a second).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env = {k: v for k, v in env.items() if k != "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"}  # JAX's default: 1 s
    env |= {"PYTHONPATH": PYTHONPATH, "XDG_CACHE_HOME": str(tmp_path / "user-cache")}
    args = ["model.name=mlp", "trainer.max_epochs=1", "handlers.progress=false", "handlers.writers=[jsonl]"]
    runs = {}
    for name in ("temporary", "b"):
        command = [sys.executable, "-m", "ember.cli", "train", *args, "--output", str(tmp_path / name / "run")]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=200, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "compilation cache" not in done.stderr, done.stderr[-3000:]
        runs[name] = read_records(tmp_path / name / "run")
        shutil.rmtree(tmp_path / "temporary", ignore_errors=True)  # a run in a temporary folder, removed after it
    assert sorted(p.name for p in (tmp_path / "user-cache").iterdir()) == ["ember"]
    assert any((tmp_path / "user-cache" / "ember" / "jax").iterdir())
    assert not list(tmp_path.glob("**/.jax-cache"))
    ((first,), (second,)) = runs["temporary"], runs["b"]
    assert first["cache_hits"] == 0
    assert second["cache_hits"] > 0  # (JAX's estimate of the time saved, cache_saved, can be below 0 for tiny programs)


def newest_step(folder):
    """The step of the newest checkpoint committed in ``folder`` (read only)."""
    steps = [json.loads(m.read_text())["step"] for m in folder.glob("step_*/manifest.json")]
    return max(steps, default=0)


def test_a_fast_dir_tier_is_what_a_killed_run_resumes_from(tmp_path):
    """handlers.checkpoint.fast_dir: SIGKILLed in its third epoch, the run resumes from the fast tier's newest step."""
    extra = [f"handlers.checkpoint.fast_dir={tmp_path / 'shm'}", "handlers.checkpoint.every_iters=3"]
    extra.append("handlers.checkpoint.durable_every=4")
    run_dir = tmp_path / "run"
    status, _, err = signalled_run(run_dir, signal.SIGKILL, "epoch   2", *extra)
    assert status == -signal.SIGKILL, err[-3000:]
    tier_id = (run_dir / "checkpoints" / "latest" / ".tier-id").read_text()
    fast = newest_step(tmp_path / "shm" / f"latest-{tier_id}" / "process-0-of-1")  # the run's own fast folder
    durable = newest_step(run_dir / "checkpoints" / "latest")
    assert fast >= durable >= 22  # every 4th save is durable too: iterations 12, 22 (the first epoch ends), 33, 44
    status, out, err = signalled_run(run_dir, signal.SIGKILL, "Resuming", *extra)
    assert f"Resuming {run_dir} from step_{fast:08d} (iteration {fast}).\n" in out, (out, err[-3000:])


def test_a_run_whose_every_update_is_skipped_stops_with_status_1_naming_the_reason(tmp_path, capsys):
    """An epoch's worth of skips in a row (22) stops the run, which says the guard is on from its first line.

    skip_nonfinite without a rollback, and a learning rate that makes every loss after the first step non-finite.
    """
    from ember.cli import main

    args = ["train", "--output", str(tmp_path / "run"), "model.name=mlp", "trainer.max_epochs=5"]
    args += ["trainer.skip_nonfinite=true", "trainer.rollback_after=null", "optimizer.learning_rate=1e30"]
    args += ["handlers.progress=false", "handlers.writers=[jsonl]", "handlers.early_stopping=null"]
    assert main([*args, "handlers.log_every=5"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("precision float32. Updates with a non-finite loss or gradients are skipped.")
    assert lines[-2] == (
        "Stopped: 23 updates in a row were skipped (iterations 2-24, the last for a non-finite loss; the limit is 22, "
        "an epoch's worth): the run is not training. Look at the data and the learning rate; trainer.rollback_after "
        "rolls back to the checkpoint before such a window."
    )
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["stopped"], summary["iterations"]) == ("skipped updates", 24)
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    skips = [(r["step"], r["train/skipped_steps"]) for r in logged if "train/skipped_steps" in r]
    assert skips == [(5, 4), (10, 9), (15, 14), (20, 19)]  # every skip is counted in the logs


def test_the_first_line_names_the_guards_spike_factor_and_its_rollback():
    from types import SimpleNamespace

    from ember.cli._config import load_config
    from ember.cli._run_course import runs_on
    from ember.training import SingleDevice

    cfg = load_config(None, ["trainer.skip_nonfinite=true", "trainer.spike_factor=4", "trainer.rollback_after=3"])
    assert runs_on(SimpleNamespace(placement=SingleDevice()), cfg).endswith(
        "precision float32. Updates with a non-finite loss or gradients, or a spike past 4 times their average, are "
        "skipped, rolled back after 3 in a row."
    )


SIGNALLED = [  # the validation data signals the process midway through a chosen pass (signalling_data.py)
    "model.name=mlp",
    "data.name=grain",
    "data.path=tests.cli.signalling_data:make",
    "trainer.max_epochs=2",
    "handlers.progress=false",
    "handlers.early_stopping=null",
    "handlers.writers=[jsonl]",
    "handlers.log_every=10",
    "evaluations.it.every_epochs=null",  # a named evaluation every 10 iterations, on the validation data
    "evaluations.it.every_iters=10",
]


def evaluation_lines(out):
    return [line for line in out.splitlines() if line.startswith("epoch ")]


def jsonl_records(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in lines]


def test_sigterm_in_an_evaluation_by_iterations_and_again_in_its_make_up_stops_each_launch_and_loses_nothing(tmp_path):
    """SIGTERM in the evaluation at iteration 10, then in the relaunch's make-up of it: 143 and one line each time.

    The second launch trains nothing (stopped before its first batch, the evaluation still owed); the third makes
    the evaluation up and finishes: every evaluation's console line and record is the uninterrupted run's, each once.
    One difference, documented: at step 10 the made-up evaluation's record follows the trainer's own (written
    before the stop), where the uninterrupted run evaluates first.
    """
    straight = ember_train_signalled(["--output", str(tmp_path / "straight"), *SIGNALLED])
    assert straight[0] == 0, straight[2][-3000:]
    run_dir = tmp_path / "run"
    args, at_first_pass = ["--output", str(run_dir), *SIGNALLED], {"EMBER_TEST_SIGNAL_AT_PASS": "1"}
    stop = (
        "Stopped at iteration 10 (SIGTERM), the checkpoint saved; run the same command to resume. Best val accuracy "
        f"none yet (no evaluation finished). Run folder: {run_dir}"
    )
    status, out, err = ember_train_signalled(args, env=at_first_pass)
    assert status == 143, err[-3000:]
    assert (evaluation_lines(out), out.splitlines()[-1]) == ([], stop)
    status, out, err = ember_train_signalled(args, env=at_first_pass)  # the relaunch's first pass: the make-up
    assert status == 143, err[-3000:]
    assert out.splitlines()[-2:] == [f"Resuming {run_dir} from step_00000010 (iteration 10).", stop]
    assert json.loads((run_dir / "summary.json").read_text())["stopped"] == "SIGTERM"
    status, out, err = ember_train_signalled(args)
    assert status == 0, err[-3000:]
    assert evaluation_lines(out) == evaluation_lines(straight[1])
    named = [re.match(r"epoch +\d+  iteration +(\d+)  (\w+) accuracy", line).groups() for line in evaluation_lines(out)]
    assert named == [("10", "it"), ("20", "it"), ("21", "val"), ("30", "it"), ("40", "it"), ("42", "val")]
    expected, records = jsonl_records(tmp_path / "straight"), jsonl_records(run_dir)
    at_10 = [i for i, r in enumerate(expected) if r.get("step") == 10]
    assert [sorted(expected[i]) for i in at_10] == [
        ["it/accuracy", "it/loss", "step"],
        *[["step", f"train/{n}"] for n in ("loss", "lr")],
    ]
    expected.insert(at_10[-1], expected.pop(at_10[0]))  # the evaluation's record after the trainer's, at step 10
    assert records == expected


def test_a_sigterm_at_the_runs_last_iteration_leaves_the_last_evaluation_and_the_record_to_the_relaunch(
    tmp_path, monkeypatch, capsys
):
    """Stopped at iteration 44 of 44, before the epoch's end: the relaunch validates, and writes the run's hparams.

    Before, the relaunch took the run for complete ("nothing to do", exit 143 again, forever): no last validation,
    no hparams record, ``"stopped": "SIGTERM"`` for good.
    """
    from ember.cli import _train

    def config(name):
        writers = {"writers": ["jsonl"], "progress": False, "early_stopping": None}
        return {
            "model": {"name": "mlp"},
            "trainer": {"max_epochs": 2},
            "handlers": writers,
            "output": str(tmp_path / name),
        }

    straight = train(config("straight"))
    attach = _train.attach_handlers

    def signalled_at_the_end(cfg, engines, run_dir, console):
        handlers = attach(cfg, engines, run_dir, console)
        last = Events.ITERATION_COMPLETED(once=cfg.trainer.max_epochs * engines.steps_per_epoch)
        engines.trainer.add_event_handler(last, lambda: os.kill(os.getpid(), signal.SIGTERM))
        return handlers

    monkeypatch.setattr(_train, "attach_handlers", signalled_at_the_end)
    stopped = train(config("run"))
    assert (stopped["iterations"], stopped["stopped"]) == (44, "SIGTERM")
    monkeypatch.setattr(_train, "attach_handlers", attach)
    capsys.readouterr()
    done = train(config("run"))
    out = capsys.readouterr().out
    assert f"Resuming {tmp_path / 'run'} from step_00000044 (iteration 44).\nepoch   2  iteration    44  val " in out
    assert {k: v for k, v in done.items() if k not in ("run_dir", "seconds")} == {
        **{k: v for k, v in straight.items() if k not in ("run_dir", "seconds")},
        "resumed_from": 44,
    }
    assert jsonl_records(tmp_path / "run") == jsonl_records(tmp_path / "straight")  # hparams once, at the end
