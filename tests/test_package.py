import subprocess
import sys

import ember


def test_engine_does_not_import_jax():
    """Importing ember and ember.engine leaves JAX unimported: the engine is pure Python."""
    code = "import sys, ember, ember.engine; print('jax' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


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
        "__version__",
    ]
    assert ember.Engine is ember.engine.Engine
    assert ember.__version__ == "0.1.0.dev0"
