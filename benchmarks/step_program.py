"""The compiled train step's program, as one fingerprint per configuration: a refactor of the step keeps them.

Speed of the step is the speed of the program XLA compiles, so a change to how the step is built (issue 46's
wrappers) that leaves every fingerprint as it was leaves the device work as it was, whatever a noisy machine's
timings say. The fingerprint is of the optimised HLO with its metadata and instruction names taken out.

Run it on two trees and compare the lines:

    PYTHONPATH=/path/to/old/src python benchmarks/step_program.py
    python benchmarks/step_program.py
"""

from __future__ import annotations

import argparse
import hashlib
import re
from typing import Any

import jax
import numpy as np
import optax
from flax import linen as nn

from ember.training import DynamicLossScale, StepGuard, TrainState, make_train_step

#: (precision, accumulate_steps, remat, guard): each wrapper of the step on, alone or with others
CONFIGS = [
    ("32-true", 1, None, False),
    ("16-mixed", 2, "full", True),
    ("bf16-mixed", 4, None, True),
    ("32-true", 2, "dots_saveable", True),
]


class _Net(nn.Module):
    @nn.compact
    def __call__(self, x: Any, train: bool = False) -> Any:
        x = nn.relu(nn.BatchNorm(use_running_average=not train)(nn.Dense(16)(x)))
        return nn.Dense(3)(nn.Dropout(0.2, deterministic=not train)(x))


def _loss(model: Any, batch: Any) -> Any:
    logits = model(batch[0])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[1]).mean(), {"p": logits.argmax(-1)}


def canonical(hlo: str) -> str:
    """``hlo`` without what names where it came from: metadata, stack frames, the module's and instructions' names."""
    hlo = re.sub(r", metadata=\{[^}]*\}", "", hlo)
    hlo = re.sub(r", stack_frame_id=\d+", "", hlo)
    hlo = hlo[hlo.index("\n%") :]  # the computations; the tables of file and function names before them go
    names: dict[str, str] = {}
    return re.sub(r"%[\w.\-]+", lambda m: names.setdefault(m.group(0), f"%v{len(names)}"), hlo)


def fingerprints() -> list[str]:
    """One line per configuration: its name, the program's length in lines and its fingerprint."""
    x, y = np.ones((16, 8), np.float32), np.zeros(16, np.int32)
    lines = []
    for precision, accumulate, remat, guard in CONFIGS:
        state = TrainState.from_linen(_Net(), x[:1], optax.adam(1e-2), rngs=("dropout",))
        if guard:
            state = state.replace(guard=StepGuard.create(3.0))
        if precision == "16-mixed":
            state = state.replace(loss_scale=DynamicLossScale.create())
        step = make_train_step(
            _loss, accumulate_steps=accumulate, remat=remat, precision=precision, extras=("grad_norm", "lr"),
            lr_schedule=lambda s: 0.01,
        )  # fmt: skip
        program = canonical(jax.jit(step).lower(state, (x, y)).compile().as_text() or "")
        name = f"{precision}, accumulate {accumulate}, remat {remat}, guard {guard}"
        lines.append(
            f"{name:54} {len(program.splitlines()):5d} lines  {hashlib.sha256(program.encode()).hexdigest()[:16]}"
        )
    return lines


if __name__ == "__main__":
    argparse.ArgumentParser(
        description="The compiled train step's program, one fingerprint per configuration."
    ).parse_args()
    print(f"jax {jax.__version__}, {jax.default_backend()}")
    print("\n".join(fingerprints()))
