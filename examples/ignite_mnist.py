"""Ignite's ``examples/mnist/mnist.py``, ported: the same script on scikit-learn's digits, then a kill and a resume.

What changed from Ignite's file, line for line: the model is a Flax module (``train`` flag for dropout),
the optimizer is ``optax.sgd(lr, momentum)``, the loss takes log-probabilities and integer labels as
``nn.NLLLoss`` does, and the loaders are ``ArrayDataset``s (no ``device=``: the trainer places the data).
Everything else is Ignite's: ``create_supervised_trainer``/``create_supervised_evaluator``, ``Accuracy``
and ``Loss`` metrics, one evaluator over the train loader (batches of 64) and the validation loader
(batches of 1000), the tqdm bar and ``state.times``. At the end the run is repeated with a stop after the
first epoch and a resume from that epoch's checkpoint (``--resume_from``, a checkpoint's folder), and the
resumed parameters are compared with the uninterrupted run's.

Run: ``python examples/ignite_mnist.py [--epochs 3]``  (needs ``pip install -e ".[examples]"``)
"""

from __future__ import annotations

import tempfile
from argparse import ArgumentParser
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from sklearn.datasets import load_digits
from tqdm import tqdm

from ember import Events
from ember.data import ArrayDataset
from ember.handlers import Checkpoint
from ember.metrics import Accuracy, Loss
from ember.training import create_supervised_evaluator, create_supervised_trainer


class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.relu(nn.max_pool(nn.Conv(10, (3, 3))(x), (2, 2), strides=(2, 2)))
        x = nn.Dropout(0.5, deterministic=not train, broadcast_dims=(1, 2))(nn.Conv(20, (3, 3))(x))  # Dropout2d
        x = nn.relu(nn.max_pool(x, (2, 2), strides=(2, 2)))
        x = nn.relu(nn.Dense(50)(x.reshape((x.shape[0], -1))))
        x = nn.Dropout(0.5, deterministic=not train)(x)
        return nn.log_softmax(nn.Dense(10)(x))


def nll_loss(log_probs, y):  # nn.NLLLoss
    return -jnp.mean(jnp.take_along_axis(log_probs, y[:, None], axis=1))


def get_data_loaders(train_batch_size, val_batch_size):
    digits = load_digits()
    x = ((digits.images / 16.0 - 0.1307) / 0.3081).astype(np.float32)[..., None]  # Normalize((0.1307,), (0.3081,))
    y = digits.target.astype(np.int32)
    train_loader = ArrayDataset((x[:1500], y[:1500]), batch_size=train_batch_size, shuffle=True)
    val_loader = ArrayDataset((x[1500:], y[1500:]), batch_size=val_batch_size)
    return train_loader, val_loader


def run(train_batch_size, val_batch_size, epochs, lr, momentum, log_interval, checkpoints=None, stop_after=None):
    train_loader, val_loader = get_data_loaders(train_batch_size, val_batch_size)
    trainer = create_supervised_trainer(Net(), optax.sgd(lr, momentum), nll_loss, rngs=("dropout",))
    val_metrics = {"accuracy": Accuracy(), "nll": Loss(nll_loss)}
    evaluator = create_supervised_evaluator(trainer, metrics=val_metrics)

    pbar = tqdm(initial=0, leave=False, total=len(train_loader), desc=f"ITERATION - loss: {0:.2f}")

    @trainer.on(Events.ITERATION_COMPLETED(every=log_interval))
    def log_training_loss(engine):
        pbar.desc = f"ITERATION - loss: {float(engine.state.output['loss']):.2f}"  # the output is a dict
        pbar.update(log_interval)

    @trainer.on(Events.EPOCH_COMPLETED)
    def log_training_results(engine):
        pbar.refresh()
        evaluator.run(train_loader)
        metrics = evaluator.state.metrics
        tqdm.write(
            f"Training Results - Epoch: {engine.state.epoch} Avg accuracy: {metrics['accuracy']:.2f} "
            f"Avg loss: {metrics['nll']:.2f}"
        )

    @trainer.on(Events.EPOCH_COMPLETED)
    def log_validation_results(engine):
        evaluator.run(val_loader)
        metrics = evaluator.state.metrics
        tqdm.write(
            f"Validation Results - Epoch: {engine.state.epoch} Avg accuracy: {metrics['accuracy']:.2f} "
            f"Avg loss: {metrics['nll']:.2f}"
        )
        pbar.n = pbar.last_print_n = 0

    @trainer.on(Events.EPOCH_COMPLETED | Events.COMPLETED)
    def log_time(engine):
        tqdm.write(f"{trainer.last_event_name.name} took {trainer.state.times[trainer.last_event_name.name]} seconds")

    if checkpoints is not None:  # the kill-and-resume part: Ignite's Checkpoint and load_objects, as in its guide
        to_save = {"trainer": trainer}
        Checkpoint(to_save, checkpoints, n_saved=2).attach(trainer, Events.EPOCH_COMPLETED)
        if stop_after is not None:
            trainer.add_event_handler(Events.EPOCH_COMPLETED(once=stop_after), lambda e: e.terminate())
    trainer.run(train_loader, max_epochs=epochs)
    pbar.close()
    return trainer


def resume(resume_from, epochs, **kwargs):
    """A new process's view: build everything, load the checkpoint's folder, run to the end."""
    train_loader, _ = get_data_loaders(kwargs["train_batch_size"], kwargs["val_batch_size"])
    trainer = create_supervised_trainer(Net(), optax.sgd(kwargs["lr"], kwargs["momentum"]), nll_loss, rngs=("dropout",))
    trainer.build_state(next(iter(train_loader)))  # a linen model is built from a batch: build it before loading
    Checkpoint.load_objects(to_load={"trainer": trainer}, checkpoint=resume_from)
    trainer.run(train_loader, max_epochs=epochs)
    return trainer


if __name__ == "__main__":
    parser = ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=64, help="input batch size for training (default: 64)")
    parser.add_argument("--val_batch_size", type=int, default=1000, help="input batch size for validation")
    parser.add_argument("--epochs", type=int, default=3, help="number of epochs to train (default: 3)")
    parser.add_argument(
        "--lr", type=float, default=0.1, help="learning rate (default: 0.1; Ignite's 0.01 needs MNIST's 60,000 images)"
    )
    parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum (default: 0.5)")
    parser.add_argument("--log_interval", type=int, default=10, help="batches between loss updates of the bar")
    args = parser.parse_args()
    settings = {
        "train_batch_size": args.batch_size,
        "val_batch_size": args.val_batch_size,
        "lr": args.lr,
        "momentum": args.momentum,
    }

    straight = run(**settings, epochs=args.epochs, log_interval=args.log_interval)
    folder = Path(tempfile.mkdtemp())
    run(**settings, epochs=args.epochs, log_interval=args.log_interval, checkpoints=folder, stop_after=1)
    resumed = resume(folder / "step_00000024", args.epochs, **settings)  # 1500 // 64 + 1 = 24 batches an epoch
    same = all(
        np.array_equal(a, b)
        for a, b in zip(
            jax.tree.leaves(straight.state.train_state), jax.tree.leaves(resumed.state.train_state), strict=True
        )
    )
    print(f"resumed from epoch 1, finished epoch {resumed.state.epoch}; identical to the uninterrupted run: {same}")
