"""A resume holds one train state at a time: per device, and on the host no more than orbax's own restore."""

import json
from pathlib import Path

import pytest

from tests.subprocesses import run_python

SCRIPT = Path(__file__).with_name("resume_memory_script.py")


def run(mode: str, folder: Path) -> dict:
    done = run_python(["-W", "error", str(SCRIPT), mode, str(folder)])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT ") :])


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resume-memory")
    ember = run("ember", folder)
    return ember, run("orbax", folder)


@pytest.mark.parametrize("store", ["orbax", "msgpack"])
def test_no_device_holds_two_copies_of_the_state_during_resume(measured, store):
    """FSDP on 8 devices: at every point where restored arrays appear, each device holds at most 1.1 x its share."""
    ember, _ = measured
    assert ember[store]["restored"] == 0.5  # the saved state (w1 doubled), not the fresh one
    assert ember[store]["device_peak"] <= 1.1 * ember["per_device_state"], ember


def test_an_orbax_resume_takes_no_more_host_memory_than_orbax_restoring_into_abstract_shapes(measured):
    """A resume (verify, release, restore) raises the host's peak memory no more than orbax alone does (+10%)."""
    ember, orbax = measured
    assert ember["orbax"]["host_growth"] <= orbax["host_growth"] + 0.1 * ember["state_bytes"], (ember, orbax)


def test_a_msgpack_resume_reads_the_state_into_host_memory_once(measured):
    """The native store reads its file into one host buffer: the peak grows by about the state's bytes, not twice."""
    ember, _ = measured
    assert ember["msgpack"]["host_growth"] <= 1.15 * ember["state_bytes"], ember
