import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn import metrics as skm

from tests.subprocesses import end_group

SCRIPT = Path(__file__).with_name("multiprocess_script.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> list[dict]:
    """The results of the two processes of one jax.distributed run on localhost (CPU, Gloo)."""
    port = str(_free_port())
    folder = str(tmp_path_factory.mktemp("checkpoints"))
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), str(pid), port, folder],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for pid in (0, 1)
    ]
    outputs = []
    try:
        outputs = [proc.communicate(timeout=180) for proc in procs]  # both, before anything is asserted
    finally:
        for proc in procs:  # each its own process group: what it started ends with it
            end_group(proc.pid)
            proc.wait(timeout=30)
    results = []
    for proc, (stdout, stderr) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, stderr[-3000:]
        line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT ") :]))
    return results


def test_compute_returns_the_global_value_on_every_process(two_processes):
    """Each process saw half the data; both report accuracy and confusion matrix over all of it."""
    rng = np.random.default_rng(0)
    scores, labels = rng.normal(size=(40, 3)).astype(np.float32), rng.integers(0, 3, size=40)
    for result in two_processes:
        assert result["accuracy"] == pytest.approx(skm.accuracy_score(labels, scores.argmax(1)))
        assert result["cm"] == skm.confusion_matrix(labels, scores.argmax(1), labels=range(3)).tolist()


def test_a_metric_written_ignites_way_sums_its_counters_over_the_processes(two_processes):
    """sync_all_reduce: each process counted its half; compute gives the accuracy over all 40 on both."""
    rng = np.random.default_rng(0)
    scores, labels = rng.normal(size=(40, 3)).astype(np.float32), rng.integers(0, 3, size=40)
    assert [r["custom"] for r in two_processes] == [r["accuracy"] for r in two_processes]
    assert two_processes[0]["custom"] == pytest.approx(skm.accuracy_score(labels, scores.argmax(1)))
    correct = [int(np.sum(scores[s].argmax(1) == labels[s])) for s in (slice(0, 20), slice(20, 40))]
    parts = two_processes[0]["custom_saved"]["processes"]  # each process's own counters, before any reduction
    assert [p["attributes"] for p in parts] == [{"_num_examples": 20, "_num_correct": c} for c in correct]
    assert two_processes[1]["custom_saved"] == two_processes[0]["custom_saved"]


def test_update_compute_update_compute_does_not_double_count(two_processes):
    """compute() leaves the local accumulators as they were (Ignite #2803): 1+2, then 11+12."""
    for pid, result in enumerate(two_processes):
        assert result["sum_twice"] == [3.0, 23.0]
        assert result["sum_local_after"] == pid + 1.0 + 10.0


def test_accumulators_that_are_already_global_are_not_merged_again(two_processes):
    """Updated from a global array spanning both processes, the sum is 1 + 2 = 3, not 6."""
    assert [r["global_sum"] for r in two_processes] == [3.0, 3.0]


def test_running_average_publishes_local_values_and_computes_their_mean(two_processes):
    """The per-iteration value stays local (no collective per step); compute() averages the processes."""
    local = [r["running_local"] for r in two_processes]
    assert local[0] != local[1]
    for result in two_processes:
        assert result["running_global"] == pytest.approx(sum(local) / 2, rel=1e-6)


def test_running_average_over_processes_divides_by_those_that_saw_data(two_processes):
    """Process 0 averaged 4 then 6 (0.98 * 4 + 0.02 * 6 = 4.04), process 1 saw nothing: 4.04 on both, not half."""
    assert [r["lonely_global"] for r in two_processes] == pytest.approx([4.04, 4.04], rel=1e-6)


def test_a_metric_no_process_updated_is_not_computable_on_every_process(two_processes):
    """Both processes raise Ignite's error together (the one that would raise alone left the other waiting)."""
    message = "Metric `Sum` was computed before any update; attach it to an engine or call `update` first."
    assert [r["nobody"] for r in two_processes] == [message, message]


def test_an_epoch_wise_metric_resumed_mid_epoch_gets_each_processs_own_part_back(two_processes):
    """Checkpointed at iteration 3 of 6: both processes' sums are saved, each resumes its own; the mean is exact."""
    expected = (sum(range(10, 16)) + sum(range(20, 26))) / 12
    for result in two_processes:
        assert result["straight_avg"] == pytest.approx(expected)
        assert result["resumed_avg"] == result["straight_avg"]
    assert [r["on_disk_when_run_returned"] for r in two_processes] == [[3], [3]]  # process 0 wrote it slowly
    saved = two_processes[0]["saved_avg"]["processes"]
    assert [part["state"]["tuple"][0]["data"] for part in saved] == [[33.0], [63.0]]  # 10+11+12, 20+21+22
    assert [part["updates"] for part in saved] == [3, 3]


def test_a_state_saved_by_three_processes_resumes_on_two_with_the_same_global_value(two_processes):
    """Process 0 takes the three parts merged (1+2+3), process 1 none: compute() is 6 on both."""
    assert [r["three_on_two"] for r in two_processes] == [{"local": 6.0, "global": 6.0}, {"local": 0.0, "global": 6.0}]
