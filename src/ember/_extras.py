"""Optional features' packages: importing one, or an error that names the extra and the command to install it."""

from __future__ import annotations

import importlib
from types import ModuleType

#: Where ember's own extras come from: ember is installed from a clone (it is not on PyPI).
INSTALL = 'pip install -e ".[{extra}]"'


def missing(feature: str, package: str, extra: str) -> str:
    """The message for ``feature`` without ``package``: the extra that brings it and the command, run in a clone.

    Examples:
        >>> from ember._extras import missing
        >>> print(missing("ProgressBar", "tqdm", "progress"))  # doctest: +ELLIPSIS
        ProgressBar needs tqdm, which ember's `progress` extra brings: pip install -e ".[progress]" in your clone ...
    """
    command = INSTALL.format(extra=extra)
    return (
        f"{feature} needs {package}, which ember's `{extra}` extra brings: {command} in your clone of ember "
        "(ember is not on PyPI)."
    )


def require(module: str, *, feature: str, package: str, extra: str) -> ModuleType:
    """``import module`` for ``feature``; if it is not installed, an ``ImportError`` that says how to install it.

    Examples:
        >>> from ember._extras import require
        >>> require("json", feature="Writing JSON", package="json", extra="cli").__name__
        'json'
        >>> require("no_such_module", feature="Flying", package="wings", extra="air")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ImportError: Flying needs wings, which ember's `air` extra brings: pip install -e ".[air]" in your clone ...
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if e.name is not None and module.split(".")[0] != e.name.split(".")[0]:
            raise  # the package is there but something it imports is broken: its own error says what
        raise ImportError(missing(feature, package, extra)) from e
