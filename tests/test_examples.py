import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.subprocesses import UNOPTIMISED

EXAMPLES = {p.name: p for p in sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.py"))}
# Scripts whose output a test of its own checks below; each script runs once in the suite.
CHECKED = {
    "engine_basics.py",
    "quickstart.py",
    "custom_early_stopping.py",
    "custom_events.py",
    "iterate_loop.py",
    "kill_and_resume.py",
    "char_transformer.py",
    "sharded_transformer.py",
    "ignite_mnist.py",
    "ignite_save_resume.py",
    "flax_nnx_mnist.py",
    "grain_from_disk.py",
    "survive_at_scale.py",
    "fine_tune.py",
}


# Examples that train long enough for LLVM's optimisation to pay for itself (`UNOPTIMISED`: 48 s against 30 s for
# the character transformer, 37 s against 24 s for the sharded one, in the suite on 2 cores).
OPTIMISED = {"char_transformer.py", "sharded_transformer.py"}


def _output(name: str) -> str:
    """The standard output of ``examples/<name>``, run to completion with warnings as errors."""
    env = dict(os.environ)
    if name in OPTIMISED:
        env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(UNOPTIMISED, "").strip()
    result = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLES[name])],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("name", sorted(set(EXAMPLES) - CHECKED))
def test_example_runs(name):
    """Every other example script runs to completion on CPU with warnings as errors."""
    _output(name)


def test_the_quickstart_is_the_quickstart_pages_program():
    """examples/quickstart.py is the page's code block, to the character.

    The program runs once in the suite: tests/test_docs.py runs the page's block and checks what it prints.
    """
    script = EXAMPLES["quickstart.py"].read_text()
    page = (EXAMPLES["quickstart.py"].parents[1] / "docs" / "quickstart.md").read_text()
    block = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert script.split('"""\n\n', 1)[1] == block


def test_engine_basics_prints_its_progress():
    """The engine alone logs every 16 iterations, converges, and shows the state dict to checkpoint."""
    out = _output("engine_basics.py")
    assert out.splitlines()[:3] == [
        "epoch  1  iteration   16  loss 0.018932",
        "epoch  2  iteration   32  loss 0.000145",
        "converged after 2 epochs",
    ]
    state = "{'epoch_length': 16, 'iteration': 32, 'max_epochs': 20, 'terminated': True}"  # ended by its handler
    assert f"engine state to checkpoint: {state}" in out


@pytest.mark.parametrize(
    ("name", "last_line"),
    [
        ("ignite_mnist.py", "resumed from epoch 1, finished epoch 3; identical to the uninterrupted run: True"),
        ("ignite_save_resume.py", "iterations 25-28 logged after the resume equal the crashed run's: True (12 lines)"),
        ("flax_nnx_mnist.py", "; resumed run identical: True"),
        ("grain_from_disk.py", "resumed at step 30, finished at 56; identical to straight: True"),
    ],
)
def test_the_ported_scripts_resume_to_the_uninterrupted_run(name, last_line):
    """Ignite's MNIST and save-resume, Flax's NNX MNIST and the Grain pipeline each end with an exact resume."""
    assert _output(name).splitlines()[-1].endswith(last_line)


def test_custom_early_stopping_stops_the_run_before_its_end():
    lines = _output("custom_early_stopping.py").splitlines()
    epoch = int(lines[-1].split()[3])
    assert lines[-3].startswith(f"epoch {epoch:2d}  val loss ")  # the epoch's line, then the verdict on it
    assert lines[-2].startswith("no improvement for 2 evaluations (best ")
    assert lines[-1] == f"stopped at epoch {epoch} of 50"
    assert epoch < 50


def test_custom_events_fire_and_filter():
    lines = _output("custom_events.py").splitlines()
    news = [line for line in lines if "new best validation accuracy" in line]
    thirds = [line.strip() for line in lines if "improvements so far" in line]
    assert thirds == [f"({3 * (i + 1)} improvements so far)" for i in range(len(news) // 3)]
    assert lines.index(thirds[0].join(["  ", ""])) == 3  # right after the third improvement


def test_iterate_loop_breaks_out_and_reports_every_50_iterations():
    lines = _output("iterate_loop.py").splitlines()
    steps = [int(line.split()[1]) for line in lines if line.startswith("step ")]
    assert steps == list(range(50, 50 * len(steps) + 1, 50))
    assert lines[-1] == f"stopped at iteration {steps[-1]}"


def test_a_killed_run_resumes_to_the_uninterrupted_result():
    """Killed once its checkpoint of iteration 20 is on disk, the run resumes and ends equal to an uninterrupted one.

    It resumes from that checkpoint, or from a later one that landed before the SIGKILL did (the child trains on
    meanwhile: 25 on a loaded machine).
    """
    lines = _output("kill_and_resume.py").splitlines()
    assert "killed the child with SIGKILL (exit status -9)" in lines
    resumed = re.fullmatch(r"child: resumed at iteration (\d+) \.\.\. checkpoint at 80 on disk", lines[-2])
    assert resumed is not None, lines[-2]
    assert int(resumed[1]) in (20, 25, 30), lines[-2]
    assert lines[-1] == "resumed run equals the uninterrupted run bit for bit: True"


def test_char_transformer_learns_the_standard_library():
    """Validation perplexity (of 256 possible bytes) falls every epoch or two and ends below 10."""
    lines = _output("char_transformer.py").splitlines()
    perplexities = [float(line.split()[-1]) for line in lines if "val perplexity" in line]
    assert len(perplexities) == 8
    assert perplexities[-1] < min(perplexities[:4])
    assert perplexities[-1] < 10


def test_the_sharded_transformer_splits_its_kernels_by_their_logical_names():
    """On 8 simulated CPU devices: a 4 x 2 (fsdp x model) mesh, kernels split by their names, perplexity falls."""
    lines = _output("sharded_transformer.py").splitlines()
    assert lines[0] == "Sharded(mesh={'fsdp': 4, 'model': 2}, batch_axes=('fsdp',)) over 8 cpu devices"
    specs = {line.split()[0]: line.split(maxsplit=2)[2].rsplit("P(", 1)[1] for line in lines if line.startswith("  [")}
    assert specs["['Block_0']['Dense_0']['kernel']"] == "'fsdp', 'model')"  # (embed, mlp)
    assert specs["['Block_0']['MultiHeadDotProductAttention_0']['query']['kernel']"] == "'fsdp', 'model', None)"
    assert specs["['Embed_0']['embedding']"] == "None, 'fsdp')"  # (vocab, embed)
    held = next(line for line in lines if line.startswith("params + optimizer state:"))
    total, one = (int(x.replace(",", "")) for x in held.split(":")[1].replace(" bytes; at most", "").split()[:2])
    assert one < total / 4
    perplexities = [float(line.split()[-1]) for line in lines if line.startswith("epoch ")]
    assert len(perplexities) == 2
    assert perplexities[1] < perplexities[0] < 256


def test_the_run_that_survives_rolls_back_twice_and_resumes_from_either_tier():
    """On 8 simulated devices: two rollbacks, the last save in both tiers, relaunches from the fast and durable tier.

    The Running at scale page shows the same program.
    """
    script = EXAMPLES["survive_at_scale.py"].read_text()
    page = (EXAMPLES["survive_at_scale.py"].parents[1] / "docs" / "concepts" / "scale.md").read_text()
    block = page.split("<!-- not run: 8 simulated devices", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert script.split('"""\n\n', 1)[1] == block
    lines = _output("survive_at_scale.py").splitlines()
    assert lines[:4] == [
        "8 devices; trained 24 iterations",
        "rolled back to iteration 4, past iterations (5, 9)",
        "rolled back to iteration 16, past iterations (17, 21)",
        "fast tier: [20, 22, 24] durable: [24]",
    ]
    assert re.fullmatch(
        r"goodput: \d+\.\d% of \d+\.\d s \(productive training steps over the wall time of every run\)", lines[4]
    )
    assert lines[5:] == ["relaunched: from iteration 24, fast tier", "fast tier wiped: from iteration 24, durable tier"]


def test_fine_tune_takes_the_body_leaves_the_new_head_fresh_and_learns_the_new_digits():
    """The second run's first lines are init_from's report; both ways to learn digits 5-9 end above 85%."""
    lines = _output("fine_tune.py").splitlines()
    first = r"from .*/step_00000190: 2 loaded, 2 left fresh, 12 not taken, 2 unused in the source"
    assert re.fullmatch(first, lines[0]), lines[0]
    assert lines[1:5] == [
        "  left fresh: params.head.bias (fresh: params.head)",
        "  left fresh: params.head.kernel (fresh: params.head)",
        "  unused: params.head.bias",
        "  unused: params.head.kernel",
    ]
    found = re.fullmatch(r"digits 5-9 after 20 steps on 100 examples: fine-tuned (\S+), from scratch (\S+)", lines[5])
    assert len(lines) == 6, lines
    assert found is not None, lines[5]
    assert min(float(found[1]), float(found[2])) > 0.85, lines[5]
