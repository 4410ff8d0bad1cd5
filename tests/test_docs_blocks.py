"""Every Python block on every docs page runs: a page's blocks in order, as one program, after a shared prelude.

Each page runs in a new interpreter, in a temporary folder, with warnings as errors.
The prelude stands for what the pages leave to the reader (a trainer, an evaluator, data, a model, a loss); each
page's blocks then run as written, later blocks seeing what earlier ones made. A block that cannot run here says
why in a ``<!-- not run: ... -->`` comment right above it, and `NOT_RUN` lists every such block, so none is
dropped silently. The README's, the home page's and the quickstart's blocks run in tests/test_docs.py.
"""

import re
from pathlib import Path

import pytest

from tests.subprocesses import devices, run_python

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RUN_ELSEWHERE = {"index.md", "quickstart.md"}  # tests/test_docs.py runs them, with what they print

PRELUDE = """
import os
import numpy as np, optax, jax, jax.numpy as jnp
import flax.training.train_state
from flax import linen as nn, nnx
from ember import Engine, Events
from ember.data import ArrayDataset
from ember.handlers import Checkpoint, EarlyStopping, ProcessWatchdog
from ember.metrics import Accuracy, Loss
from ember.training import TrainState, create_evaluator, create_trainer
from ember.cli._registry import digits_arrays  # load_digits' arrays, without importing scikit-learn

images, target = digits_arrays()
x = (images[..., None] / 16).astype("float32")[:512]
y = target.astype("int32")[:512]
train_data = data = ArrayDataset({"x": x[:384], "y": y[:384]}, batch_size=64, shuffle=True)
val_data = eval_data = ArrayDataset({"x": x[384:], "y": y[384:]}, batch_size=128)
sample_x = sample_batch = x[:1]


class Model(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.relu(nn.Dense(32, name="mlp_in")(x.reshape((x.shape[0], -1))))
        return nn.Dense(10, name="mlp_out")(x)


model = module = Model()
FlaxModel = Model
nnx_module = nnx.Linear(64, 10, rngs=nnx.Rngs(0))
apply_fn, params = (lambda p, x: x @ p), jnp.zeros(3)
flax_state = flax.training.train_state.TrainState.create(apply_fn=apply_fn, params=params, tx=optax.sgd(0.1))
per_example_loss = optax.softmax_cross_entropy_with_integer_labels


def loss_fn(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()


def eval_fn(model, batch):
    return {"y_pred": model(batch["x"]), "y": batch["y"]}


state = TrainState.from_linen(model, sample_x, optax.adam(1e-3))
fresh_state = TrainState.from_linen(model, sample_x, optax.adam(1e-3))
trainer = create_trainer(state, loss_fn)
evaluator = create_evaluator(trainer, eval_fn)
trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: evaluator.run(val_data))
records = [{"x": x[i], "y": y[i]} for i in range(384)]
os.makedirs("data/train", exist_ok=True)
np.save("data/train/x.npy", x[:384])
np.save("data/train/y.npy", y[:384])
done = lambda state: state.iteration >= 12  # noqa: E731
"""

#: Every block that is not run here, by page and index, with the reason its page gives.
NOT_RUN = {
    ("cli.md", 1): "needs the run folder and the file above",
    ("cli.md", 2): "needs the run folder, its model's module and the file above",
    ("concepts/distributed.md", 0): "several processes",
    ("concepts/distributed.md", 1): "several processes",
    ("concepts/distributed.md", 2): "several processes",
    ("concepts/distributed.md", 3): "several processes",
    ("concepts/scale.md", 4): "8 simulated devices: examples/survive_at_scale.py is this program",
    ("migrating/ignite.md", 0): "PyTorch Ignite's side",
    ("migrating/lightning.md", 0): "the Lightning-style side",
}

#: What a page's text says is in place before its blocks (the checkpoints page: an accuracy and early stopping).
PAGE_SETUP = {
    "concepts/data.md": """
import grain
normalise = lambda record: record  # noqa: E731


class RandomCrop(grain.transforms.RandomMap):
    def random_map(self, element, rng):
        return element
""",
    "concepts/checkpoints.md": """
Accuracy().attach(evaluator, "accuracy")
stop = EarlyStopping(3, lambda e: e.state.metrics["accuracy"], trainer)
stop.attach(evaluator)
""",
}

#: Pages whose blocks need more devices than one: the simulated CPU devices they run on.
DEVICES = {"concepts/sharded.md": 8}


def blocks(page: Path) -> list[tuple[str, str | None]]:
    """``(code, reason not run or None)`` for each Python block of ``page``."""
    found = re.findall(r"(<!-- not run: ([^>]*?) -->\n)?```python\n(.*?)^```", page.read_text(), re.S | re.M)
    return [(code, reason or None) for _, reason, code in found]


PAGES = sorted(
    str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if str(p.relative_to(DOCS)) not in RUN_ELSEWHERE and blocks(p)
)


def test_the_blocks_not_run_are_the_ones_listed():
    marked = {(page, i): reason for page in PAGES for i, (_, reason) in enumerate(blocks(DOCS / page)) if reason}
    assert marked == NOT_RUN


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_of_the_page_runs_in_order(page, tmp_path):
    code = "\n".join(block for block, reason in blocks(DOCS / page) if reason is None)
    env = {"JAX_PLATFORMS": "cpu"}
    if page in DEVICES:
        env["XLA_FLAGS"] = devices(DEVICES[page])
    done = run_python(["-W", "error", "-c", PRELUDE + PAGE_SETUP.get(page, "") + "\n" + code], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
