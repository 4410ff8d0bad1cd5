"""Test configuration shared by the whole suite."""

import atexit
import os
import shutil
import tempfile

import pytest
from hypothesis import settings

from tests.subprocesses import UNOPTIMISED

# One XLA compilation cache for the run, this process and the scripts it launches: the suite compiles the
# same small models again and again (an example's second trainer, a resumed run, each test's own trainer),
# and on two cores compiling is most of its time. A new folder each run, removed at exit, so nothing
# carries over between runs. Set before JAX is imported; a cache the caller chose is kept.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _CACHE = tempfile.mkdtemp(prefix="ember-tests-xla-")
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

# Compiled without LLVM's optimisation, here and in the processes the tests start (`tests.subprocesses.UNOPTIMISED`).
if UNOPTIMISED not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {UNOPTIMISED}".lstrip()


# Hypothesis: the same examples every run (derandomized, no example database), so a red CI run is red again on a
# rerun and a green one stays green; HYPOTHESIS_PROFILE=explore draws new ones, many more of them, to look for bugs.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def fresh_compilations():
    """Compile for real in this test (no cache hits), for tests that count compilations."""
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", True)


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    """A one-epoch ``ember train`` run of the built-in MLP (AdamW, 10 classes), made once per module: its folder."""
    from ember.cli import main

    folder = tmp_path_factory.mktemp("mlp") / "run"
    args = ["train", "model.name=mlp", "trainer.max_epochs=1", "handlers.progress=false", f"--output={folder}"]
    assert main(args) == 0
    return folder


def stored(run, kind="latest"):
    """The arrays of a run's latest (or best) checkpoint as its store holds them (the trainer's, by name), its info."""
    from ember.checkpoint import open_store

    tree, info = open_store(run / "checkpoints" / kind).restore()
    return tree["trainer"], info


# Scripts that tests run in subprocesses (8 simulated devices; two jax.distributed processes; a small disk), never
# imported here: each is named *_script.py.
collect_ignore_glob = ["*_script.py"]


# The suite runs on every core (pytest-xdist, `-n auto` in pyproject.toml), a test file to a worker (`--dist
# loadfile`: a file's module fixtures, a compiled model or an 8-device subprocess, are made once). The files that
# take longest go first, so no worker is left with one of them at the end while the other idles (pytest-xdist 3.8
# orders files by their number of tests unless told not to: `--no-loadscope-reorder` in pyproject.toml).
FIRST = (
    "tests/benchmarks/test_workloads.py",
    "tests/benchmarks/test_startup.py",
    "tests/benchmarks/test_host_speed.py",
    "tests/training/test_sharded.py",
    "tests/test_examples.py",
    "tests/cli/test_cli.py",
    "tests/cli/test_distributed.py",
    "tests/distributed/test_lost_process.py",
    "tests/test_docs_blocks.py",
    "tests/cli/test_trackers.py",
    "tests/training/test_placement.py",
    "tests/cli/test_verify_resume.py",
    "tests/cli/test_records.py",
    "tests/cli/test_stops.py",
    "tests/distributed/test_multiprocess_training.py",
    "tests/data/test_grain.py",
    "tests/cli/test_evaluations.py",
)


def pytest_collection_modifyitems(config, items):
    """The longest files first (their order above), then the rest in collection order."""
    rank = {path: i for i, path in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(FIRST)))


def _matrix_lines(matrix):
    return [f"{save} | {point} | {how} | {launches} | yes" for save, point, how, launches in matrix]


def pytest_sessionfinish(session):
    """On a worker: hand the relaunch matrix's cells to the controller, which prints the summary."""
    import sys

    relaunch = sys.modules.get("tests.handlers.test_relaunch")
    if hasattr(session.config, "workeroutput") and relaunch is not None:
        session.config.workeroutput["relaunch_matrix"] = _matrix_lines(relaunch.MATRIX)


_WORKER_LINES: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per core, at most 4 (each holds JAX and starts 8-device and 2-process runs of its own)."""
    return max(1, min(os.cpu_count() or 1, 4))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """On the controller: a worker's relaunch matrix, as it finished."""
    _WORKER_LINES.extend(getattr(node, "workeroutput", {}).get("relaunch_matrix", []))


def pytest_terminal_summary(terminalreporter):
    """Print the relaunch matrix (tests/handlers/test_relaunch.py) for the cells that ran and passed."""
    import sys

    relaunch = sys.modules.get("tests.handlers.test_relaunch")  # run in this process (no workers)
    lines = _matrix_lines(relaunch.MATRIX) if relaunch is not None else _WORKER_LINES
    if not lines:
        return
    terminalreporter.write_sep("-", "relaunch matrix: cells that passed")
    terminalreporter.write_line("checkpoints at | interrupted at | by | launches to complete | same as uninterrupted")
    for line in lines:
        terminalreporter.write_line(line)
