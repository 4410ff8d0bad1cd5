"""ember's version, in a module that imports nothing, so any layer may record it (a checkpoint's manifest)."""

__version__ = "0.1.0.dev0"
