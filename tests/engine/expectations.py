"""Event orders that the engine tests assert and that ``docs/concepts/events.md`` must show verbatim.

``tests/test_docs.py`` checks the documentation against these; the engine tests check the engine.
"""

ITER = ["GET_BATCH_STARTED", "GET_BATCH_COMPLETED", "ITERATION_STARTED", "ITERATION_COMPLETED"]

# Epoch 1 over three batches, then the start of epoch 2: its first fetch finds the data exhausted.
_FIRST_EPOCH = ["STARTED", "EPOCH_STARTED", *ITER * 3, "EPOCH_COMPLETED"]
_SECOND_EPOCH_FIRST_ITERATION = [
    "EPOCH_STARTED",
    "GET_BATCH_STARTED",
    "DATALOADER_STOP_ITERATION",
    "GET_BATCH_COMPLETED",
    "ITERATION_STARTED",
    "ITERATION_COMPLETED",
]

#: ``Engine(...).run([10, 20, 30], max_epochs=2)``: 31 events.
RUN_TWO_EPOCHS = [*_FIRST_EPOCH, *_SECOND_EPOCH_FIRST_ITERATION, *ITER * 2, "EPOCH_COMPLETED", "COMPLETED"]

#: ``run(data=None, epoch_length=2, max_epochs=1)``: no GET_BATCH events.
RUN_WITHOUT_DATA = [
    "STARTED",
    "EPOCH_STARTED",
    *["ITERATION_STARTED", "ITERATION_COMPLETED"] * 2,
    "EPOCH_COMPLETED",
    "COMPLETED",
]

#: ``run([1, 2, 3], max_iters=4)``: the partial second epoch ends with TERMINATE, no EPOCH_COMPLETED.
RUN_MAX_ITERS = [*_FIRST_EPOCH, *_SECOND_EPOCH_FIRST_ITERATION, "TERMINATE", "COMPLETED"]

#: The termination table: for each call (made by a handler of the named event, during the first
#: epoch of ``run([10, 20, 30], max_epochs=2)``), the events that follow that event, up to and
#: including the next EPOCH_STARTED or the end of ``run()``.
TERMINATION = {
    "terminate() at ITERATION_COMPLETED": ["TERMINATE", "COMPLETED"],
    "terminate(skip_completed=True) at ITERATION_COMPLETED": ["TERMINATE"],
    "terminate() at STARTED": ["TERMINATE", "COMPLETED"],
    "terminate() at EPOCH_COMPLETED": ["TERMINATE", "COMPLETED"],
    "terminate_epoch() at ITERATION_COMPLETED": ["TERMINATE_SINGLE_EPOCH", "EPOCH_COMPLETED", "EPOCH_STARTED"],
    "terminate_epoch(skip_epoch_completed=True) at ITERATION_COMPLETED": ["TERMINATE_SINGLE_EPOCH", "EPOCH_STARTED"],
    "terminate_epoch() at GET_BATCH_STARTED": ["TERMINATE_SINGLE_EPOCH", "EPOCH_COMPLETED", "EPOCH_STARTED"],
    "terminate_epoch() at EPOCH_COMPLETED": ["EPOCH_STARTED"],
    "terminate_epoch() at EPOCH_STARTED": ["EXCEPTION_RAISED"],
    "terminate_epoch() at STARTED": ["EXCEPTION_RAISED"],
    "interrupt() at ITERATION_COMPLETED": ["INTERRUPT"],
}
