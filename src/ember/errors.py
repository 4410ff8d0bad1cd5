"""ember's public exceptions, in one place; each subclasses the builtin a caller would catch without knowing ember.

They are also exported where they are raised (``ember.checkpoint.CorruptCheckpointError``, ...). This module
imports nothing, so every layer may use it.

Examples:
    >>> from ember.errors import ConfigError, CorruptCheckpointError, NonFiniteError
    >>> issubclass(ConfigError, ValueError), issubclass(NonFiniteError, FloatingPointError)
    (True, True)
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that does not fit the schema; the message names the field, the value and the choices.

    Examples:
        >>> from ember.cli import ConfigError, load_config
        >>> try:
        ...     load_config({"trainer": {"max_epoch": 3}})
        ... except ConfigError as e:
        ...     print(e)  # doctest: +ELLIPSIS
        trainer.max_epoch: unknown field; did you mean 'max_epochs'? (allowed: compilation_cache, eval_every, ...)
    """


class CorruptCheckpointError(ValueError):
    """A checkpoint on disk whose files do not match what its manifest says (or whose manifest is damaged).

    The message names the checkpoint's folder and the file at fault. Stores never return such a checkpoint:
    [`latest`][ember.checkpoint.CheckpointFolder.latest] and the readers move it aside (renamed ``corrupt-<name>``,
    never deleted) and fall back to the newest valid one.

    Examples:
        >>> from ember.checkpoint import CorruptCheckpointError
        >>> issubclass(CorruptCheckpointError, ValueError)
        True
    """


class NonFiniteError(FloatingPointError):
    """Raised by ``TerminateOnNan`` with ``action="raise"``: an output was NaN or infinite.

    Examples:
        >>> from ember.handlers import NonFiniteError
        >>> issubclass(NonFiniteError, FloatingPointError)
        True
    """


class NotComputableError(RuntimeError):
    """A metric computed before any update: Ignite's ``ignite.exceptions.NotComputableError``, by its name.

    Examples:
        >>> from ember.metrics import Accuracy, NotComputableError
        >>> try:
        ...     Accuracy().compute()
        ... except NotComputableError as e:
        ...     print(e)  # doctest: +ELLIPSIS
        Metric `Accuracy` was computed before any update; attach it to an engine or call `update` first.
    """


class RunHeldError(RuntimeError):
    """Another live launch holds the run folder (or the watcher's folder): the message names it and the way out.

    ``ember train``, ``ember resume`` and ``ember eval --watch`` raise it at start, before they write anything; the
    command line prints it in one line and exits with status 75 (try again later: the run itself is fine).

    Examples:
        >>> import tempfile
        >>> from ember._run_holder import hold
        >>> from ember.errors import RunHeldError
        >>> folder = tempfile.mkdtemp()
        >>> with hold(folder, "run"):
        ...     try:
        ...         hold(folder, "run")
        ...     except RunHeldError as e:
        ...         print("refused:", "held by another launch of this run" in str(e))
        refused: True
    """


class ProcessesMissing(TimeoutError):
    """Processes of the run did not reach a point where all meet within the wait timeout (stalled, stuck or lost).

    ``missing`` lists them; the message names them, the point and the timeout (``EMBER_WAIT_TIMEOUT``).
    [`ProcessWatchdog`][ember.handlers.ProcessWatchdog] and ``ember train --distributed`` end the process with
    status 75 on it, as for a lost process: relaunch every process.

    Examples:
        >>> from ember.handlers import ProcessesMissing
        >>> error = ProcessesMissing([1], "commit", 5.0)
        >>> str(error)
        "process 1 did not reach 'commit' within 5 s (EMBER_WAIT_TIMEOUT): stalled, stuck or lost"
        >>> error.missing, error.why
        ([1], "did not reach 'commit' within 5 s (EMBER_WAIT_TIMEOUT)")
    """

    def __init__(self, missing: list[int], point: str, timeout: float) -> None:
        who = f"process{'es' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
        self.missing, self.point = missing, point
        self.why = f"did not reach {point!r} within {timeout:g} s (EMBER_WAIT_TIMEOUT)"
        super().__init__(f"{who} {self.why}: stalled, stuck or lost")


__all__ = [
    "ConfigError",
    "CorruptCheckpointError",
    "NonFiniteError",
    "NotComputableError",
    "ProcessesMissing",
    "RecordError",
    "RunHeldError",
]


class RecordError(ValueError):
    """A data source could not produce one record; `index` names it, the message the original error.

    Raised by ember's sources ([`NpySource`][ember.data.NpySource], and any source passed to
    [`GrainPipeline`][ember.data.GrainPipeline]) in place of the error reading the record raised, so the run fails
    naming the record, even when a worker process read it.

    Examples:
        >>> from ember.errors import RecordError
        >>> e = RecordError("record 13 of NpySource('x.npy') could not be read: OSError('bad block')", index=13)
        >>> e.index, isinstance(e, ValueError)
        (13, True)
    """

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.index = index

    def __reduce__(self) -> tuple[type[RecordError], tuple[str, int]]:  # crosses to and from worker processes
        return RecordError, (str(self), self.index)
