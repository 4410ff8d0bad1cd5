"""A run whose handler hangs, watched by a StallWatchdog: run by tests/handlers/test_stall.py.

``python stall_script.py RUN_DIR``: the engine's third ITERATION_COMPLETED runs a handler that sleeps for a minute;
the watchdog (step_timeout 1 s) writes its diagnosis into RUN_DIR and exits with status 75 long before.
"""

import sys
import time

from ember import Engine, Events
from ember.handlers import StallWatchdog

engine = Engine(lambda engine, batch: batch)


def sleepy(engine):
    time.sleep(60)


engine.add_event_handler(Events.ITERATION_COMPLETED(once=3), sleepy)
StallWatchdog(sys.argv[1], step_timeout=1.0, startup_timeout=30.0).attach(engine)
engine.run(range(10))
print("the run was not stopped")
