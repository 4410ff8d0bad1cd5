"""Where a run's progress goes, and so how it is shown: a bar on a terminal, a widget in a notebook, lines elsewhere.

One decision for the progress bar and for ``ember train``'s console: a bar redrawn in place belongs on a terminal; a
file or a pipe (a batch log under Slurm, CI, ``nohup``) gets one plain line an epoch, no carriage returns or escape
codes; a Jupyter kernel gets tqdm's widget (``ipywidgets``), or plain lines when ipywidgets is missing.
"""

from __future__ import annotations

import sys
from typing import Any, Literal, TextIO

Shown = Literal["bar", "widget", "lines"]
CHOICES = ("auto", "bar", "widget", "lines")


def on_a_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (a bar redrawn in place belongs there, not in a log file).

    Examples:
        >>> import io
        >>> from ember.handlers._reporting.display import on_a_terminal
        >>> on_a_terminal(io.StringIO())
        False
    """
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def in_a_notebook() -> bool:
    """Whether this process is a Jupyter kernel (tqdm.autonotebook's test: IPython's kernel app is configured).

    Examples:
        >>> from ember.handlers._reporting.display import in_a_notebook
        >>> in_a_notebook()
        False
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None  # pyright: ignore[reportAttributeAccessIssue]
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def widgets_available() -> bool:
    """Whether tqdm can draw its notebook widget (it needs ipywidgets)."""
    try:
        from tqdm.notebook import IProgress  # pyright: ignore[reportAttributeAccessIssue]
    except ImportError:  # pragma: no cover - tqdm.notebook needs IPython, which a kernel has
        return False
    return IProgress is not None


def shown_as(display: str, stream: TextIO | None) -> Shown:
    """How progress written to ``stream`` (``None``: standard error) is shown, for ``display`` (``"auto"`` decides).

    ``"auto"``: a widget in a notebook (when the stream is the notebook's own: ``None``, standard output or error),
    plain lines there when ipywidgets is missing, a bar on a terminal, lines on anything else.

    Examples:
        >>> import io
        >>> from ember.handlers._reporting.display import shown_as
        >>> shown_as("auto", io.StringIO()), shown_as("bar", io.StringIO())
        ('lines', 'bar')
    """
    if display not in CHOICES:
        raise ValueError(f"`display` must be one of {', '.join(map(repr, CHOICES))}; got {display!r}.")
    if display != "auto":
        if display == "widget" and not (in_a_notebook() and widgets_available()):
            raise ValueError(
                "display='widget' draws tqdm's notebook widget: it needs a Jupyter kernel and ipywidgets "
                "(ember's `notebook` extra); use display='auto' to fall back to lines elsewhere."
            )
        return display  # type: ignore[return-value]  # checked against CHOICES above
    if stream in (None, sys.stdout, sys.stderr) and in_a_notebook():
        return "widget" if widgets_available() else "lines"
    return "bar" if on_a_terminal(stream or sys.stderr) else "lines"
