"""`ember verify-resume`: the user's own proof that a run resumes exactly after a real SIGKILL."""

import re

from ember.cli import main
from tests.subprocesses import devices, run_python


def report(how, devices="the same 1 device(s)"):
    """The lines of one relaunch's comparison (16 steps, mlp), the resumed iteration as ``N``."""
    return [
        f"16 iterations straight, and SIGKILLed after iteration 13 then relaunched on {devices}: resumed from "
        f"iteration N; compared {how}:",
        "  the relaunch resumed from a checkpoint (iteration N)",
        "  epochs of 22 iterations: the relaunch resumed in the first, so a data pipeline that reshuffles each pass "
        "was not checked (--steps 49, the default, resumes in the second)",
        "  last checkpoint: iteration 16 and 16",
        "  the train state's 16 arrays have the same names",
        f"  parameters: 4 arrays equal {how.split(' of ')[0].replace('a relative ', '')}",
        f"  optimizer state: 10 arrays equal {how.split(' of ')[0].replace('a relative ', '')}",
        f"  the rest of the state: 2 arrays equal {how.split(' of ')[0].replace('a relative ', '')}",
        "  counters, data position, metrics' and handlers' states: equal",
        "  logged records: 33 equal, each once",  # the loss and the learning rate of 16 steps; the hyperparameters
    ]


def resumed_as_n(out):
    """The report with the iteration the relaunch resumed from as ``N`` (4, 8 or 12: a background save may lag)."""
    found = set(re.findall(r"from iteration (\d+)|checkpoint \(iteration (\d+)\)", out))
    assert {a or b for a, b in found} <= {"4", "8", "12"}, out
    return re.sub(r"(from iteration|checkpoint \(iteration) (4|8|12)", r"\1 N", out).splitlines()


def test_by_default_a_run_resumes_bit_for_bit_past_an_epochs_end(tmp_path, capsys):
    """By default the relaunch resumes in epoch 2 and runs past its end, equal to the straight run.

    49 steps (two epochs of 22 and a quarter), a checkpoint every 12, a real SIGKILL after iteration 37: the relaunch
    resumes in epoch 2, runs past its end (a validation, a new pass of the data) and ends where the straight run did,
    its records (the validations and the one hparams record included) equal.
    """
    assert main(["verify-resume", "model.name=mlp", "--workdir", str(tmp_path), "--keep"]) == 0
    out = capsys.readouterr().out
    resumed = {int(n) for n in re.findall(r"resumed from iteration (\d+)", out)}
    assert len(resumed) == 1
    assert resumed <= {22, 24, 36}, out  # a background save may lag; every one is past the first epoch's end
    n = resumed.pop()
    assert out.splitlines() == [
        f"49 iterations straight, and SIGKILLed after iteration 37 then relaunched on the same 1 device(s): resumed "
        f"from iteration {n}; compared bit for bit:",
        f"  the relaunch resumed from a checkpoint (iteration {n})",
        f"  epochs of 22 iterations: the relaunch resumed in epoch 2 and ran past its end (iteration 44), over "
        f"iterations {n + 1}-49",
        "  last checkpoint: iteration 49 and 49",
        "  the train state's 16 arrays have the same names",
        "  parameters: 4 arrays equal bit for bit",
        "  optimizer state: 10 arrays equal bit for bit",
        "  the rest of the state: 2 arrays equal bit for bit",
        "  counters, data position, metrics' and handlers' states: equal",
        "  logged records: 101 equal, each once",  # loss and rate of 49 steps, 2 validations, the hparams record
        "resume is exact: bit for bit.",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["resumed", "straight"]  # kept: --keep


def test_by_default_a_pipeline_reshuffling_from_a_random_state_the_checkpoint_lacks_is_caught(tmp_path, capsys):
    """Each pass reshuffled from NumPy's global state: the relaunch, resumed in epoch 2, draws epoch 1's order."""
    args = ["verify-resume", "model.name=mlp", "data.name=grain", "data.path=tests.cli.reshuffled_data:make"]
    assert main([*args, "--workdir", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "  DIFFERS: parameters: first differing leaf trainer/params.Dense_0.bias" in lines
    assert any(line.startswith("  epochs of 21 iterations: the relaunch resumed in epoch 2") for line in lines)
    assert lines[-1] == f"resume is NOT exact; the runs are kept in {tmp_path} to look at."


def test_on_eight_devices_it_also_relaunches_on_four_within_a_tolerance():
    done = run_python(
        ["-m", "ember.cli", "verify-resume", "model.name=mlp", "--steps", "16"],
        env={"XLA_FLAGS": devices(8)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert resumed_as_n(done.stdout) == [
        *report("bit for bit", "the same 8 device(s)"),
        *report("within a relative 1e-05 of each array's largest value", "4 of the 8 devices"),
        "resume matches (bit for bit where stated, within the tolerance elsewhere).",
    ]


def test_a_run_that_cannot_resume_exactly_is_caught_naming_the_first_leaf(tmp_path, capsys):
    """A model whose initial parameters depend on the process: the relaunched run is not the straight one."""
    args = ["verify-resume", "model.name=tests.cli.unseeded_model:Unseeded", "--steps", "16"]
    assert main([*args, "--workdir", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "  DIFFERS: parameters: first differing leaf trainer/params.Dense_0.bias" in lines  # sorted by name
    assert lines[-1] == f"resume is NOT exact; the runs are kept in {tmp_path} to look at."
    assert sorted(p.name for p in tmp_path.iterdir()) == ["resumed", "straight"]


def test_too_few_steps_and_a_config_mistake_are_refused_before_any_run(capsys):
    assert main(["verify-resume", "--steps", "3"]) == 2
    assert capsys.readouterr().err == (
        "ember: error: --steps must be at least 8 (a checkpoint every quarter, a kill after the third), got 3.\n"
    )
    assert main(["verify-resume", "trainer.max_epoch=3"]) == 2
    assert "trainer.max_epoch: unknown field; did you mean 'max_epochs'?" in capsys.readouterr().err


def test_every_switch_that_adds_a_handler_or_a_record_resumes_exactly(tmp_path, capsys, mlp_run):
    """Each config switch that adds a handler or a record, all at once, resumes bit for bit past an epoch's end.

    A named evaluation every 10 iterations, histograms every 10, a fast checkpoint tier, bf16-mixed precision and the
    hparams record, in a fine-tuning run (``init:``, a new head) keeping a moving average of its parameters: a new
    record or handler among them that does not resume exactly fails here.
    """
    config = tmp_path / "switches.yaml"
    config.write_text(
        "model: {name: mlp}\n"
        "optimizer: {ema: 0.05}\n"
        f"init: {{source: {mlp_run}, fresh: [params.Dense_1]}}\n"
        "trainer: {precision: bf16-mixed}\n"
        f"handlers: {{histograms: 10, hparams: true, checkpoint: {{fast_dir: {tmp_path / 'fast'}}}}}\n"
        "evaluations: {noisy: {noise: 0.3, every_iters: 10}}\n"
    )
    assert main(["verify-resume", str(config), "--workdir", str(tmp_path / "runs")]) == 0, capsys.readouterr().out
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "resume is exact: bit for bit."
    assert any(line.startswith("  epochs of 22 iterations: the relaunch resumed in epoch 2") for line in lines)
    assert not [line for line in lines if "DIFFERS" in line]
