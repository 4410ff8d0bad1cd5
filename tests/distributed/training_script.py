"""One process of tests/distributed/test_multiprocess_training.py.

``python training_script.py PID NPROC PORT WORKDIR [nan|agree|grain]``: trains the same model on the same
global batches with the data-parallel placement over every process's devices (4 CPU devices in all), with
metrics, a logger and checkpoints; prints ``RESULT {json}``. With NPROC=1 it is the single-process
reference. With ``nan``, process 1's data holds a NaN (process 0's does not); with ``grain``, each
process reads its part of every batch through a GrainPipeline with two worker processes.
"""

import json
import os
import sys

pid, nproc, port, workdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
inject_nan = sys.argv[5:] == ["nan"]
agree = sys.argv[5:] == ["agree"]
grain_data = sys.argv[5:] == ["grain"]  # the same global batches through a GrainPipeline with 2 worker processes
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={4 // nproc}"

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ember import Events  # noqa: E402
from ember.checkpoint import CheckpointStore  # noqa: E402
from ember.data import ArrayDataset  # noqa: E402
from ember.handlers import Checkpoint, ScalarLogger, TerminateOnNan  # noqa: E402
from ember.metrics import Accuracy, Average  # noqa: E402
from ember.training import DataParallel, TrainState, create_trainer  # noqa: E402
from ember.writers import JsonlWriter  # noqa: E402
from tests.training.models import LinenNet, batches, classification_loss  # noqa: E402


def main():
    if nproc > 1:
        jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=nproc, process_id=pid)

    ARRAYS = {"x": np.concatenate([b["x"] for b in batches(4)]), "y": np.concatenate([b["y"] for b in batches(4)])}
    if inject_nan and pid == 1:
        ARRAYS["x"][:, 0] = np.nan  # only this process's inputs are bad

    def loss_with_labels(model, batch):
        loss, aux = classification_loss(model, batch)
        return loss, {**aux, "y": batch["y"]}

    state = TrainState.from_linen(LinenNet(), ARRAYS["x"][:2], optax.sgd(0.1), seed=0, rngs=("dropout",))
    trainer = create_trainer(state, loss_with_labels, placement=DataParallel())
    data = ArrayDataset(ARRAYS, batch_size=16, shuffle=True, seed=3, drop_remainder=True)  # shard: "auto"
    if grain_data:
        from ember.data import GrainPipeline

        records = [{"x": x, "y": y} for x, y in zip(ARRAYS["x"], ARRAYS["y"], strict=True)]
        data = GrainPipeline(records, batch_size=16, shuffle=True, seed=3, worker_count=2)  # shard: "auto"
    Average(key="loss").attach(trainer, "loss")
    Accuracy(output_transform=lambda o: (o["logits"], o["y"])).attach(trainer, "accuracy")
    TerminateOnNan(lambda o: o["loss"]).attach(trainer)
    ScalarLogger(JsonlWriter(os.path.join(workdir, "log.jsonl"))).attach(trainer, Events.EPOCH_COMPLETED)
    saver = Checkpoint({"trainer": trainer}, os.path.join(workdir, "ckpt"), n_saved=None)
    saver.attach(trainer, Events.EPOCH_COMPLETED)
    state = trainer.run(data, max_epochs=3)

    if agree:  # decisions from one process's clock or signal: every process must stop at the same iteration
        import signal

        from ember.handlers import Preemption, TimeLimit

        def run_until(handler_setup):
            t = create_trainer(
                TrainState.from_linen(LinenNet(), ARRAYS["x"][:2], optax.sgd(0.1), seed=0, rngs=("dropout",)),
                loss_with_labels,
                placement=DataParallel(),
            )
            handler_setup(t)
            return t.run(ArrayDataset(ARRAYS, batch_size=16, drop_remainder=True), max_epochs=3).iteration

        def late_clock(t):  # process 1's clock passes the limit at its third iteration, process 0's never does
            def clock():
                return 1000.0 if pid == 1 and t.state.iteration >= 3 else 0.0

            TimeLimit(100.0, check_every=2, clock=clock).attach(t)  # checked, and agreed, at 2, 4, ...

        def signal_one(t):  # SIGTERM reaches process 1 only, during iteration 5
            saver = Checkpoint({"trainer": t}, os.path.join(workdir, "preempted"), n_saved=None)
            Preemption(saver, check_every=2).attach(t)
            if pid == 1:
                t.add_event_handler(Events.ITERATION_COMPLETED(once=5), lambda: os.kill(os.getpid(), signal.SIGTERM))

        agreed = {"time_limit": run_until(late_clock), "preemption": run_until(signal_one)}
    else:
        agreed = {}

    def host(x):
        return np.asarray(x.addressable_data(0)).tolist()

    sharded = jax.make_array_from_process_local_data(
        trainer.placement.batch_sharding(False), np.ones((8, 2), np.float32)
    )
    try:  # an array split over the processes cannot be gathered onto process 0 by the msgpack store
        CheckpointStore(os.path.join(workdir, "sharded")).save({"w": sharded}, step=1)
        sharded_error = None
    except ValueError as e:
        sharded_error = str(e)

    print(
        "RESULT "
        + json.dumps(
            {
                "params": [host(x) for x in jax.tree.leaves(trainer.state.train_state.params)],
                "metrics": {k: float(v) for k, v in state.metrics.items()},
                "iteration": state.iteration,
                "local_batch": int(data.batch_size // data.shard[1]),
                "sharded_error": sharded_error,
                "agreed": agreed,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":  # Grain's worker processes import this file too: they must not run it
    main()
