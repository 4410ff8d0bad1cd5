"""Ignite's ``examples/mnist/mnist_with_tensorboard_logger.py``, ported: the same logging, to TensorBoard.

Ignite attaches handlers to a ``TensorboardLogger``; here each handler takes the writer and attaches to
the engine (one ``TensorBoardWriter``, shared through one background thread):

- ``OutputHandler(tag="training", output_transform=lambda loss: {"batchloss": loss}, metric_names="all")``
  is ``ScalarLogger(writer, tag="training", output_transform=..., metric_names="all")``;
- the two evaluators' ``OutputHandler(..., global_step_transform=global_step_from_engine(trainer))`` are
  ``ScalarLogger`` with the same ``global_step_transform``;
- ``OptimizerParamsHandler`` is ``LRMonitor``;
- ``WeightsScalarHandler``, ``WeightsHistHandler``, ``GradsScalarHandler`` and ``GradsHistHandler`` keep
  their names; the norms and gradients are computed in the compiled step (``extras=``), not per module.

The model, data and optimizer are ``ignite_mnist.py``'s. At the end the event file is read back and its
tags are printed.

Run: ``python examples/ignite_mnist_tensorboard.py [--epochs 2] [--log_dir DIR]``  (needs the examples extra)
"""

from __future__ import annotations

import struct
import tempfile
from argparse import ArgumentParser
from pathlib import Path

import optax
from ignite_mnist import Net, get_data_loaders, nll_loss  # the script beside this one
from tensorboardX.proto.event_pb2 import Event

from ember import Events
from ember.handlers import (
    GradsHistHandler,
    GradsScalarHandler,
    LRMonitor,
    ScalarLogger,
    WeightsHistHandler,
    WeightsScalarHandler,
    global_step_from_engine,
)
from ember.metrics import Accuracy, Loss
from ember.training import create_supervised_evaluator, create_supervised_trainer
from ember.writers import TensorBoardWriter


def read_events(log_dir):
    """The events of the event files in ``log_dir`` (TFRecord framing around tensorboardX's Event proto)."""
    events = []
    for path in sorted(Path(log_dir).rglob("events.out.tfevents*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            events.append(Event.FromString(data[pos + 12 : pos + 12 + length]))  # after the length and its crc
            pos += 12 + length + 4
    return events


def run(train_batch_size, val_batch_size, epochs, lr, momentum, log_dir):
    train_loader, val_loader = get_data_loaders(train_batch_size, val_batch_size)
    trainer = create_supervised_trainer(
        Net(), optax.sgd(lr, momentum), nll_loss, rngs=("dropout",), extras=("grad_norms", "param_norms", "grads")
    )
    metrics = {"accuracy": Accuracy(), "loss": Loss(nll_loss)}
    train_evaluator = create_supervised_evaluator(trainer, metrics=metrics)
    validation_evaluator = create_supervised_evaluator(trainer, metrics=metrics)

    @trainer.on(Events.EPOCH_COMPLETED)
    def compute_metrics(engine):
        train_evaluator.run(train_loader)
        validation_evaluator.run(val_loader)

    tb = TensorBoardWriter(log_dir)
    every = Events.ITERATION_COMPLETED(every=10)  # Ignite logs every 100 of MNIST's 938 batches; digits has 24
    ScalarLogger(
        tb, tag="training", output_transform=lambda out: {"batchloss": out["loss"]}, metric_names="all"
    ).attach(trainer, every)
    for tag, evaluator in [("training", train_evaluator), ("validation", validation_evaluator)]:
        ScalarLogger(
            tb, tag=tag, metric_names=["loss", "accuracy"], global_step_transform=global_step_from_engine(trainer)
        ).attach(evaluator, Events.EPOCH_COMPLETED)
    LRMonitor(tb, schedule=lambda step: lr, tag="lr").attach(trainer, every)
    WeightsScalarHandler(tb).attach(trainer, every)
    WeightsHistHandler(tb).attach(trainer, Events.EPOCH_COMPLETED)
    GradsScalarHandler(tb).attach(trainer, every)
    GradsHistHandler(tb).attach(trainer, Events.EPOCH_COMPLETED)

    trainer.run(train_loader, max_epochs=epochs)
    return validation_evaluator.state.metrics["accuracy"]


if __name__ == "__main__":
    parser = ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--val_batch_size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1, help="Ignite's 0.01 needs MNIST's 60,000 images")
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--log_dir", type=str, default=None, help="default: a new temporary folder")
    args = parser.parse_args()
    log_dir = args.log_dir or tempfile.mkdtemp()
    accuracy = run(args.batch_size, args.val_batch_size, args.epochs, args.lr, args.momentum, log_dir)

    scalars, histograms = set(), set()
    for event in read_events(log_dir):
        for value in event.summary.value:
            (histograms if value.HasField("histo") else scalars).add(value.tag)
    print("scalars:", ", ".join(sorted(scalars)))
    print("histograms:", ", ".join(sorted(histograms)))
    # the per-step loss and the evaluators' loss no longer share a tag; every layer is there
    assert {"training/batchloss", "training/loss", "validation/accuracy", "lr"} <= scalars
    assert {f"{kind}/norm/Dense_0.kernel" for kind in ("grads", "weights")} <= scalars
    assert {"grads/Conv_0.kernel", "weights/Conv_0.kernel"} <= histograms
    print(
        f"validation accuracy after {args.epochs} epochs: {accuracy:.2f}; TensorBoard: tensorboard --logdir {log_dir}"
    )
