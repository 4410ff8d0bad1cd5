import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script):
    """Every example script runs to completion on CPU with warnings as errors."""
    result = subprocess.run(
        [sys.executable, "-W", "error", str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr


def test_quickstart_prints_its_progress():
    """The quickstart logs every 16 iterations, converges, and shows the state dict to checkpoint."""
    script = next(p for p in EXAMPLES if p.name == "quickstart.py")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[:3] == [
        "epoch  1  iteration   16  loss 0.018932",
        "epoch  2  iteration   32  loss 0.000145",
        "converged after 2 epochs",
    ]
    assert "engine state to checkpoint: {'epoch_length': 16, 'iteration': 32, 'max_epochs': 20}" in out
