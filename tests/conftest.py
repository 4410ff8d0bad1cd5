"""Test configuration shared by the whole suite."""

# Run in a subprocess with 8 simulated devices by tests/training/test_placement.py, never imported here.
collect_ignore = ["training/multidevice_script.py"]
