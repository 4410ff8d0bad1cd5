"""`ember plan`: a config's steps compiled ahead of time, their memory per device, and the batch search."""

import re

import pytest

from ember.cli import main, plan_run


def test_plan_prints_both_steps_and_whether_they_fit(capsys):
    assert main(["plan", "model.name=mlp", "--memory", "1GiB"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "ember plan: cpu, placement SingleDevice, precision 32-true, 1 step(s) per call"
    assert lines[1] == "train step on 1 device, batch 64, per device:"
    assert [line.split()[0] for line in lines[2:14]] == [
        "state.params",
        "state.opt_state",
        "state.model_state",
        "state.other",
        "arguments",
        "outputs",
        "aliased",
        "temporaries",
        "peak",
        "generated",
        "flops",
        "fits:",
    ]
    assert re.fullmatch(r"fits: needs [\d.]+ (KiB|MiB) of 1\.00 GiB per device", lines[13])
    assert lines[14] == "eval step on 1 device, batch 359, per device:"
    assert lines[-1].startswith("fits: needs ")


@pytest.mark.parametrize(
    "placement", [["trainer.placement=fsdp"], ["trainer.placement=sharded", "trainer.mesh={fsdp: 1}"]]
)
def test_plan_works_for_a_sharded_placement_whose_state_is_built_from_a_batch(capsys, placement):
    """The state's factory is traced for its shapes with the mesh set outside the trace (set_mesh refuses inside)."""
    assert main(["plan", "model.name=mlp", *placement, "--memory", "1GiB"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "ember plan: cpu, placement Sharded, precision 32-true, 1 step(s) per call"
    assert re.fullmatch(r"fits: needs [\d.]+ (KiB|MiB) of 1\.00 GiB per device", lines[13])
    assert lines[-1].startswith("fits: needs ")


def test_the_largest_batch_found_fits_and_the_next_multiple_does_not(capsys):
    budget = 2**20
    assert main(["plan", "model.name=mlp", "--memory", "1MiB", "--max-batch"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    found = int(re.fullmatch(r"largest batch that fits: (\d+) \(data\.batch_size=\1\)", last).group(1))
    assert found % 8 == 0
    fits = plan_run({"model": {"name": "mlp"}, "data": {"batch_size": found}}, memory=budget).splitlines()
    over = plan_run({"model": {"name": "mlp"}, "data": {"batch_size": found + 8}}, memory=budget).splitlines()
    assert fits[13].startswith("fits: ")
    assert over[13].startswith("does not fit: ")


def test_a_precision_and_a_budget_too_small(capsys):
    assert main(["plan", "model.name=mlp", "trainer.precision=bf16-true", "--memory", "1kB"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "ember plan: cpu, placement SingleDevice, precision bf16-true, 1 step(s) per call"
    assert "does not fit: needs " in out
    assert " of 1000 B per device" in out


def test_without_a_budget_on_a_device_that_reports_no_limit_it_names_the_flag(capsys):
    """CPU reports no memory limit: each plan says so in plain words and the last line names --memory, no Python."""
    assert main(["plan", "model.name=mlp"]) == 0
    lines = capsys.readouterr().out.splitlines()
    verdicts = [line for line in lines if line.startswith("needs ")]
    assert len(verdicts) == 2
    for verdict in verdicts:
        assert re.fullmatch(
            r"needs [\d.]+ (KiB|MiB) per device \(no memory limit known here: plan with a budget to compare\)", verdict
        )
    assert lines[-1] == "This device reports no memory limit: --memory 8GiB (say) compares the plans with a budget."
    assert "memory=" not in "\n".join(lines)


def test_a_size_that_is_not_one_is_refused(capsys):
    with pytest.raises(SystemExit) as exited:  # argparse's usage error
        main(["plan", "--memory", "8x"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "ember plan: error: argument --memory: expected a size such as 8GiB, 512MiB, 2GB or a number of bytes, got '8x'"
    )
