"""`ember train`'s use of JAX's persistent compilation cache: where it lives, and which programs it keeps."""

from __future__ import annotations

import os
from pathlib import Path

import jax


def use_compilation_cache(setting: str | None) -> None:
    """Turn JAX's persistent compilation cache on as ``trainer.compilation_cache`` says, unless JAX has one already.

    ``auto`` is the user's cache folder (``$XDG_CACHE_HOME/ember/jax``, else ``~/.cache/ember/jax``): it outlives any
    run folder, a temporary one included (JAX keeps writing to the folder it was given for the rest of the process,
    so a folder removed with its run would fail every later write), and a relaunch from anywhere finds its entries.
    Every program is kept, however quickly it compiled, unless JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS says
    otherwise.
    """
    if setting is None or jax.config.values.get("jax_compilation_cache_dir"):
        return
    folder = user_cache_folder() if setting == "auto" else Path(setting).resolve()
    jax.config.update("jax_compilation_cache_dir", str(folder))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        # JAX keeps only programs that took over a second to compile: none of the digits run's (0.9 s, 0.1 s), so a
        # relaunch compiled everything again. Kept, a relaunch starts 2.7 s sooner for 0.17 s more on the first run.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def user_cache_folder() -> Path:
    """Where ``trainer.compilation_cache: auto`` keeps JAX's compiled programs: the user's cache folder, for ember.

    Examples:
        >>> from ember.cli._compilation_cache import user_cache_folder
        >>> user_cache_folder().parts[-2:]
        ('ember', 'jax')
    """
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser().resolve() / "ember" / "jax"
