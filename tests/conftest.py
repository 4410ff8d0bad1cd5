"""Test configuration shared by the whole suite."""

import atexit
import os
import shutil
import tempfile

import pytest
from hypothesis import settings

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


# Scripts that tests run in subprocesses (8 simulated devices; two jax.distributed processes; a small disk), never
# imported here: each is named *_script.py.
collect_ignore_glob = ["*_script.py"]


def pytest_terminal_summary(terminalreporter):
    """Print the relaunch matrix (tests/handlers/test_relaunch.py) for the cells that ran and passed."""
    import sys

    relaunch = sys.modules.get("tests.handlers.test_relaunch")
    if relaunch is None or not relaunch.MATRIX:
        return
    terminalreporter.write_sep("-", "relaunch matrix: cells that passed")
    terminalreporter.write_line("checkpoints at | interrupted at | by | launches to complete | same as uninterrupted")
    for save, point, how, launches in relaunch.MATRIX:
        terminalreporter.write_line(f"{save} | {point} | {how} | {launches} | yes")
