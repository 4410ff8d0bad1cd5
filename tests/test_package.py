import subprocess
import sys

import ember


def test_engine_does_not_import_jax():
    """Importing ember and ember.engine leaves JAX unimported: the engine is pure Python."""
    code = "import sys, ember, ember.engine; print('jax' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_training_with_a_linen_model_does_not_import_flax_nnx():
    """flax.nnx (which imports IPython: half a second) is imported only by the NNX paths, not by a linen user's."""
    code = (
        "import sys, numpy as np, optax, flax.linen as nn, ember.training as t, ember.handlers, ember.cli\n"
        "state = t.TrainState.from_linen(nn.Dense(2), np.ones((1, 3), np.float32), optax.sgd(0.1))\n"
        "t.create_supervised_trainer(nn.Dense(2), optax.sgd(0.1), lambda p, y: ((p - y) ** 2).mean())\n"
        "print('flax.nnx' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]


def test_top_level_reexports_the_engine():
    """`ember` re-exports the engine's public names and a version string."""
    assert ember.__all__ == [
        "Engine",
        "EventEnum",
        "Events",
        "EventsList",
        "FilteredEvent",
        "RemovableEventHandle",
        "State",
        "Stateful",
        "TreeStateful",
        "__version__",
        "collect_handles",
    ]
    assert sorted(ember.engine.__all__) == sorted(name for name in ember.__all__ if name != "__version__")
    assert ember.Engine is ember.engine.Engine
    assert ember.__version__ == "0.1.0.dev0"


def test_public_exceptions_live_in_errors_and_subclass_their_builtins():
    """One class per exception, re-exported where it is raised; each is caught as its builtin."""
    import ember.checkpoint
    import ember.cli
    import ember.data
    import ember.errors
    import ember.handlers
    import ember.metrics

    assert ember.checkpoint.CorruptCheckpointError is ember.errors.CorruptCheckpointError
    assert ember.cli.ConfigError is ember.errors.ConfigError
    assert ember.handlers.NonFiniteError is ember.errors.NonFiniteError
    assert ember.handlers.ProcessesMissing is ember.errors.ProcessesMissing
    bases = {name: getattr(ember.errors, name).__bases__ for name in ember.errors.__all__}
    assert bases == {
        "ConfigError": (ValueError,),
        "CorruptCheckpointError": (ValueError,),
        "NonFiniteError": (FloatingPointError,),
        "NotComputableError": (RuntimeError,),
        "ProcessesMissing": (TimeoutError,),
        "RecordError": (ValueError,),
        "RunHeldError": (RuntimeError,),
    }
    assert ember.cli.RunHeldError is ember.errors.RunHeldError
    assert ember.data.RecordError is ember.errors.RecordError
    assert ember.metrics.NotComputableError is ember.errors.NotComputableError


# What each layer may import (docs: ../shared/DESIGN.md, "Layers"). ember.errors, ember._version, ember._extras
# (an optional feature's import, and the error naming its extra), ember._protocols (the contracts all layers
# share: state and position), ember._ledger_file (the goodput ledger's file, read by handlers and by the CLI
# without JAX) and ember._flat_tree (a train state as the flat names its checkpoints hold, which the trainer writes
# and `ember.checkpoint.init_from` reads) import nothing of ember and are open to all;
# ember._multiprocess (what processes decide together) imports nothing of ember and is open to all but the engine,
# which knows nothing of JAX.
ALLOWED = {
    "engine": set(),
    "data": set(),
    "checkpoint": set(),
    "writers": set(),
    "metrics": {"engine"},
    "training": {"engine", "data"},
    "handlers": {"engine", "checkpoint", "writers", "metrics"},
    "cli": {"", "engine", "training", "data", "metrics", "checkpoint", "handlers", "writers"},
}


def test_the_architecture_page_shows_the_layers_the_test_holds():
    """docs/architecture.md's layer table is ALLOWED: the map readers see cannot drift from the code."""
    import re
    from pathlib import Path

    page = (Path(ember.__file__).parents[2] / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `ember\.(\w+)` \| [^|]+ \| ([^|]+) \|$", page, flags=re.M)
    shown = {
        layer: set()
        if imports.strip() == "—"
        else {"", *ALLOWED} - {layer}
        if imports.strip() == "every layer"
        else set(re.findall(r"`(\w+)`", imports))
        for layer, imports in rows
    }
    assert shown == ALLOWED


def test_each_layer_imports_only_the_layers_below_it():
    """The import arrows follow the design's layer table: no layer reaches up or sideways."""
    import re
    from pathlib import Path

    root = Path(ember.__file__).parent
    found = {}
    for layer in ALLOWED:
        text = "\n".join(p.read_text() for p in (root / layer).rglob("*.py"))
        used = set(re.findall(r"^\s*(?:from|import) ember(?:\.([a-z_]+))?", text, flags=re.M))
        open_to_all = {"errors", "_version", "_extras", "_protocols", "_ledger_file", "_atomic_file", "_run_identity"}
        open_to_all |= {"_flat_tree"}
        open_to_all |= {"_run_holder"}
        found[layer] = used - {layer, *open_to_all, "_multiprocess" if layer != "engine" else ""}
    assert found == {layer: allowed & found[layer] for layer, allowed in ALLOWED.items()}


def test_every_missing_extra_names_itself_and_the_command_for_a_clone(monkeypatch):
    """A feature without its package says which extra brings it and how to install it from a clone of ember."""
    import re
    import sys
    import tomllib
    from pathlib import Path

    import pytest

    from ember.handlers import ProgressBar

    root = Path(ember.__file__).parents[2]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("grain") for dep in extras["cli"])  # every data source the CLI documents
    sources = {p: p.read_text() for p in [*(root / "src").rglob("*.py"), *(root / "docs").rglob("*.md")]}
    named = set()
    for path, text in sources.items():
        assert "pip install 'ember[" not in text, path  # ember is not on PyPI: that is someone else's package
        named |= set(re.findall(r'missing\("[^"]+", "[^"]+", "(\w+)"\)', text))
        named |= set(re.findall(r'extra="(\w+)"\)', text))
    assert named - {"air", "cli", "progress"}, named  # found beyond the examples named here
    assert named <= set(extras) | {"air"}, named  # "air": the doctest's made-up extra
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if tqdm were not installed
    with pytest.raises(ImportError) as info:
        ProgressBar()
    assert str(info.value) == (
        'ProgressBar needs tqdm, which ember\'s `progress` extra brings: pip install -e ".[progress]" in your clone '
        "of ember (ember is not on PyPI)."
    )
