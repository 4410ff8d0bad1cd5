"""`ember verify-resume`: a user's own proof that their run resumes exactly after a SIGKILL, before trusting a requeue.

The config is trained for a few steps in fresh processes: straight through; then SIGKILLed mid-epoch after a
checkpoint and relaunched (the same command), which resumes and finishes. Where more than one device is visible,
the kill and the relaunch are done again with the relaunch on half of them. The last checkpoints and the logged
records of each resumed run are compared with the straight run's, leaf by leaf: bit for bit on the CPU with the
same devices, within `RTOL` of each array's largest value otherwise.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: The environment variable that makes ``ember train`` SIGKILL itself once this iteration is done (verify-resume's).
KILL_AT = "EMBER_KILL_AT_ITERATION"

#: The tolerance, relative to each array's largest value, where a bit-for-bit match is not expected: a relaunch on
#: another number of devices (the sums' order changes), or a backend other than the CPU.
RTOL = 1e-5


@dataclass
class Verdict:
    """What `verify_resume` found: each comparison's line, and whether everything matched."""

    lines: list[str] = field(default_factory=list)
    exact: bool = True

    def check(self, ok: bool, line: str) -> None:
        self.lines.append(("  " if ok else "  DIFFERS: ") + line)
        self.exact = self.exact and ok


def verify_resume(
    items: Sequence[str], *, steps: int | None = None, workdir: str | None = None, keep: bool = False
) -> Verdict:
    """Train the config of ``items`` (a config file and ``KEY=VALUE`` overrides) straight, killed and resumed; compare.

    Where resume bugs live is an epoch's end: a data pipeline that reshuffles each pass from a random state the
    checkpoint does not hold gives the relaunch's later passes another order. So by default the runs are two epochs
    and a quarter long (`default_steps`): the SIGKILL lands in the second epoch, the relaunch resumes there (from a
    checkpoint past the first epoch's end) and runs past the second's. The verdict says which epochs were covered,
    or that the relaunch resumed in the first (``steps`` too few) and such a pipeline was not checked.

    Args:
        items: what ``ember train`` takes on its command line, without ``--output``.
        steps: iterations of each run; a checkpoint every quarter, the SIGKILL just after the third (default:
            `default_steps` of the config's epoch length).
        workdir: where the three runs' folders go (a temporary folder, removed when they match, by default).
        keep: keep the run folders even when they match.

    Examples:
        >>> from ember.cli._verify_resume import verify_resume
        >>> verify_resume(["model.name=mlp"], steps=3)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: --steps must be at least 8 (a checkpoint every quarter, a kill after the third), got 3.
    """
    epoch = _epoch_length(items)
    if steps is None:
        steps = default_steps(epoch)
    if steps < 8:
        raise ValueError(
            f"--steps must be at least 8 (a checkpoint every quarter, a kill after the third), got {steps}."
        )
    every = steps // 4
    kill_at = 3 * every + 1  # the step after the third checkpoint: mid-epoch unless an epoch ends there
    root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="ember-verify-resume-"))
    root.mkdir(parents=True, exist_ok=True)
    overrides = [
        f"trainer.max_iters={steps}",
        f"handlers.checkpoint.every_iters={every}",
        "handlers.progress=false",
        "handlers.writers=[jsonl]",
        "handlers.log_every=1",
        "handlers.stall=null",
    ]
    devices, cpu = _device_count()
    fewer = _fewer_devices(devices)
    verdict = Verdict()
    straight = root / "straight"
    relaunches = [(root / "resumed", {}, 0.0 if cpu else RTOL)]
    if fewer:  # the same kill, relaunched on half the devices: the sums' order changes, so within a tolerance
        relaunches.append((root / f"resumed-on-{devices // 2}", fewer, RTOL))
    for folder in (straight, *(folder for folder, _, _ in relaunches)):
        if folder.exists():
            shutil.rmtree(folder)
    _train([*items, *overrides], straight, {}, "the straight run")
    for folder, env, rtol in relaunches:
        _train([*items, *overrides], folder, {KILL_AT: str(kill_at)}, "the run to kill", expect_kill=True)
        again = _train([*items, *overrides], folder, env, "the relaunch")
        found = re.search(r"^Resuming .* \(iteration (\d+)\)\.$", again, re.M)
        start = found.group(1) if found else "nothing (it started over)"
        where = f"on {devices // 2} of the {devices} devices" if env else f"on the same {devices} device(s)"
        how = "bit for bit" if rtol == 0 else f"within a relative {rtol:g} of each array's largest value"
        verdict.lines.append(
            f"{steps} iterations straight, and SIGKILLed after iteration {kill_at} then relaunched {where}: resumed "
            f"from iteration {start}; compared {how}:"
        )
        verdict.check(found is not None, f"the relaunch resumed from a checkpoint (iteration {start})")
        verdict.lines.append("  " + _epochs_covered(epoch, int(found.group(1)) if found else 0, steps))
        _compare_checkpoints(straight, folder, verdict, rtol)
        _compare_records(straight, folder, verdict, rtol)
    tolerant = any(rtol for _, _, rtol in relaunches)
    verdict.lines.append(
        f"resume is NOT exact; the runs are kept in {root} to look at."
        if not verdict.exact
        else "resume matches (bit for bit where stated, within the tolerance elsewhere)."
        if tolerant
        else "resume is exact: bit for bit."
    )
    if verdict.exact and not keep and workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    return verdict


def default_steps(epoch: int | None) -> int:
    """Two epochs and a quarter of ``epoch`` iterations, at least 8 (40 when the epoch's length is not known).

    With a checkpoint every quarter and the kill after the third, the relaunch resumes in the second epoch and runs
    past its end.

    Examples:
        >>> from ember.cli._verify_resume import default_steps
        >>> default_steps(22), default_steps(2), default_steps(None)
        (49, 8, 40)
    """
    return 40 if epoch is None else max(8, 2 * epoch + max(1, epoch // 4))


def _epoch_length(items: Sequence[str]) -> int | None:
    """The iterations of an epoch of the config of ``items`` (``data.epoch_length``, or its data's ``len()``)."""
    from ember.cli._classifier import learning_rates
    from ember.cli._config import config_from
    from ember.cli._registry import build_data

    cfg = config_from(items, "verify-resume")
    if cfg.data.epoch_length is not None:
        return cfg.data.epoch_length
    cfg.trainer.max_iters = cfg.trainer.max_iters or 1  # the length is the data's; no schedule needs it here
    return learning_rates(cfg, build_data(cfg.data)[0])[0]


def _epochs_covered(epoch: int | None, resumed: int, steps: int) -> str:
    """The verdict's line on the epochs the relaunch went through: whether a pass after the first was compared."""
    if epoch is None:
        return (
            "the data has no len() and no data.epoch_length: where its epochs end is not known, so a pipeline that "
            "reshuffles each pass may go unchecked"
        )
    first = resumed // epoch + 1  # the epoch the relaunch resumed in (a checkpoint at an epoch's end: the next)
    if first < 2:
        return (
            f"epochs of {epoch} iterations: the relaunch resumed in the first, so a data pipeline that reshuffles "
            f"each pass was not checked (--steps {default_steps(epoch)}, the default, resumes in the second)"
        )
    past = f" and ran past its end (iteration {first * epoch})" if steps > first * epoch else ""
    over = f"over iterations {resumed + 1}-{steps}"
    return f"epochs of {epoch} iterations: the relaunch resumed in epoch {first}{past}, {over}"


def _device_count() -> tuple[int, bool]:
    """The devices visible here, and whether they are CPUs (where a resume is bit for bit)."""
    import jax

    return jax.device_count(), jax.default_backend() == "cpu"


def _fewer_devices(devices: int) -> dict[str, str]:
    """The environment that gives a relaunch half the devices (CPU: XLA's flag; GPU: the visible devices)."""
    if devices < 2 or devices % 2:
        return {}
    import jax

    if jax.default_backend() == "cpu":
        flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
        return {"XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={devices // 2}".strip()}
    if jax.default_backend() == "gpu":
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(devices // 2))}
    return {}


def _train(args: list[str], output: Path, env: dict[str, str], what: str, expect_kill: bool = False) -> str:
    """``ember train ARGS --output OUTPUT`` in a fresh process: its output, or a ``RuntimeError`` saying how."""
    done = subprocess.run(
        [sys.executable, "-m", "ember.cli", "train", *args, "--output", str(output)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    if expect_kill and done.returncode == -9:
        return ""
    if done.returncode != 0 or expect_kill:
        how = "finished before the kill: give more --steps" if expect_kill and done.returncode == 0 else ""
        raise RuntimeError(
            f"{what} ({output}) ended with status {done.returncode}{'; ' + how if how else ''}:\n{done.stderr[-3000:]}"
        )
    return done.stdout


def _compare_checkpoints(straight: Path, resumed: Path, verdict: Verdict, rtol: float) -> None:
    from ember.checkpoint import open_store

    a_store, b_store = open_store(straight / "checkpoints" / "latest"), open_store(resumed / "checkpoints" / "latest")
    (a, a_info), (b, b_info) = a_store.restore(), b_store.restore()
    a_store.close()
    b_store.close()
    verdict.check(a_info.step == b_info.step, f"last checkpoint: iteration {a_info.step} and {b_info.step}")
    flat_a, flat_b = _leaves(a), _leaves(b)
    verdict.check(sorted(flat_a) == sorted(flat_b), f"the train state's {len(flat_a)} arrays have the same names")
    groups: dict[str, list[str]] = {"parameters": [], "optimizer state": [], "the rest of the state": []}
    for name in sorted(set(flat_a) & set(flat_b)):
        leaf = name.split("/", 1)[-1]
        kind = (
            "parameters" if leaf.startswith("params.") else "optimizer state" if leaf.startswith("opt_state.") else None
        )
        groups[kind or "the rest of the state"].append(name)
    how = "bit for bit" if rtol == 0 else f"within {rtol:g}"
    for kind, names in groups.items():
        first = next((n for n in names if not _same(flat_a[n], flat_b[n], rtol)), None)
        verdict.check(
            first is None,
            f"{kind}: {len(names)} arrays equal {how}" if first is None else f"{kind}: first differing leaf {first}",
        )
    states_a = a_info.manifest.get("metadata", {}).get("state_dicts")
    states_b = b_info.manifest.get("metadata", {}).get("state_dicts")
    states_match = _close(states_a, states_b, rtol)
    verdict.check(
        states_match,
        "counters, data position, metrics' and handlers' states: equal"
        if states_match
        else f"counters, data position or handlers' states differ: {_first_difference(states_a, states_b)}",
    )


def _compare_records(straight: Path, resumed: Path, verdict: Verdict, rtol: float) -> None:
    a, b = _records(straight / "metrics.jsonl"), _records(resumed / "metrics.jsonl")
    steps_ok = [r.get("step") for r in a] == [r.get("step") for r in b]
    same = steps_ok and all(_close(x, y, rtol) for x, y in zip(a, b, strict=True))
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if not _close(x, y, rtol)), min(len(a), len(b)))
    verdict.check(
        same,
        f"logged records: {len(a)} equal, each once"
        if same
        else f"logged records: {len(a)} and {len(b)}, the first differing at line {first + 1}",
    )


def _records(path: Path) -> list[dict[str, Any]]:
    """The logged records, less what measures time (the wall clock's ``time``, the ``stragglers/...`` host times)."""
    if not path.exists():
        return []
    return [
        {k: v for k, v in json.loads(line).items() if k != "time" and not k.startswith("stragglers/")}
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def _leaves(trees: Any) -> dict[str, np.ndarray]:
    return {f"{name}/{leaf}": np.asarray(value) for name, tree in trees.items() for leaf, value in tree.items()}


def _same(a: np.ndarray, b: np.ndarray, rtol: float) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if rtol == 0 or not np.issubdtype(a.dtype, np.floating):
        return a.tobytes() == b.tobytes()
    scale = float(np.max(np.abs(a))) if a.size else 0.0  # near-zero entries: judged against the array's scale
    return bool(np.allclose(a, b, rtol=rtol, atol=rtol * scale, equal_nan=True))


def _close(a: Any, b: Any, rtol: float) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rtol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rtol) for x, y in zip(a, b, strict=True))
    if rtol and isinstance(a, float) and isinstance(b, float):
        return bool(np.isclose(a, b, rtol=rtol, atol=0.0, equal_nan=True))
    return a == b


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b or a[k] != b[k]:
                return _first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
    return f"{path}: {a!r} != {b!r}"
