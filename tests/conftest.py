"""Test configuration shared by the whole suite."""

# Scripts that tests run in subprocesses (8 simulated devices; two jax.distributed processes), never imported here.
collect_ignore = [
    "training/multidevice_script.py",
    "training/sharded_script.py",
    "distributed/sharded_script.py",
    "metrics/multiprocess_script.py",
    "distributed/training_script.py",
    "distributed/lost_process_script.py",
    "handlers/resume_script.py",
    "faults/kill_script.py",
]


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
