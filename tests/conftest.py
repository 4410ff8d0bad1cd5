"""Test configuration shared by the whole suite."""

# Scripts that tests run in subprocesses (8 simulated devices; two jax.distributed processes), never imported here.
collect_ignore = [
    "training/multidevice_script.py",
    "metrics/multiprocess_script.py",
    "distributed/training_script.py",
    "distributed/lost_process_script.py",
    "handlers/resume_script.py",
    "faults/kill_script.py",
]
