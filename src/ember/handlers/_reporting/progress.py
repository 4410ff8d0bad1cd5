"""`ProgressBar`: tqdm bars for epochs and iterations, refreshed from values already on the host."""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TextIO

import numpy as np

from ember._extras import missing
from ember.engine import Engine, Events, FilteredEvent, RemovableEventHandle, collect_handles
from ember.handlers._attached import hold
from ember.handlers._reporting.display import CHOICES, in_a_notebook, shown_as
from ember.handlers._reporting.values import check_names, check_transform, pick
from ember.writers import is_primary_process
from ember.writers._async import start_host_copy

#: Ignite's bar: ``Epoch [2/50]: [64/128]  50%|█████      , loss=0.123 [06:17<12:34]``
IGNITE_FORMAT = "{desc}[{n_fmt}/{total_fmt}] {percentage:3.0f}%|{bar}{postfix} [{elapsed}<{remaining}]"


def postfix(values: Mapping[str, Any], unshown: set[str]) -> dict[str, Any]:
    """What the bar shows of ``values``, flattened as Ignite flattens them.

    A number as is, a string as is, a 1-D value or a sequence as ``name_0``, ``name_1``..., a mapping as
    ``name_key``. Anything else warns once per name (``unshown``).
    """
    shown: dict[str, Any] = {}
    for key, value in values.items():
        _flatten(key, value, shown, unshown)
    return shown


def _flatten(key: str, value: Any, into: dict[str, Any], unshown: set[str]) -> None:
    if isinstance(value, str):
        into[key] = value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(f"{key}_{k}", v, into, unshown)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _flatten(f"{key}_{i}", v, into, unshown)
    elif value is not None:
        array = np.asarray(value)
        if array.ndim == 0 and array.dtype.kind in "biuf":
            into[key] = array.item()
        elif array.ndim == 1 and array.dtype.kind in "biuf":
            into.update((f"{key}_{i}", x) for i, x in enumerate(array.tolist()))
        elif key not in unshown:
            unshown.add(key)
            warnings.warn(
                f"ProgressBar cannot show {key!r}: a value of shape {array.shape} and dtype {array.dtype}; it shows "
                "numbers, strings, and 1-D values (as name_0, name_1, ...).",
                UserWarning,
                stacklevel=2,
            )


class ProgressBar:
    """An iteration bar per epoch (and optionally an epoch bar), with the loss and metrics in the postfix.

    Needs tqdm: ``pip install -e ".[progress]"``. Ignite's bar, ``Epoch [2/50]: [64/128]  50%|█████ , loss=0.123
    [06:17<12:34]`` (``Iteration`` for a one-epoch run; ``desc`` in its place when given), moving every
    ``refresh_every`` iterations (Ignite's moves every iteration:
    ``attach(..., event_name=Events.ITERATION_COMPLETED)``).
    Its postfix shows values fetched at the previous refresh: at each refresh the current values start copying to
    the host and the ones started last time are displayed, so the bar never waits for the device. At EPOCH_COMPLETED
    the epoch's metrics (already host numbers) are shown. Numbers and strings are shown as they are, a 1-D value as
    ``name_0``, ``name_1``... (Ignite's), anything else is left out with a warning. Totals come from
    ``epoch_length``; data of unknown length gets a bar without a total or ETA. A bar attached to an evaluator
    while the trainer's is open is drawn below it and removed when the evaluation ends. A run resumed mid-epoch gets
    a bar for the rest of that epoch. Only the primary process draws.

    What is drawn follows where it goes (``display="auto"``): a bar on a terminal; tqdm's widget in a Jupyter
    notebook (ember's ``notebook`` extra brings ipywidgets; without it, lines and a one-time note); and on a file or
    a pipe (a batch log under Slurm, CI, ``nohup``) one plain line an epoch, ``Epoch [2/50]: [128/128] 00:06,
    loss=0.123``, with no carriage returns or escape codes. ``display="bar"``, ``"widget"`` or ``"lines"`` chooses.

    Args:
        refresh_every: iterations between refreshes.
        persist: keep each epoch's finished bar on screen.
        epoch_bar: also draw a bar over the epochs.
        iteration_bar: draw the bar over each epoch's iterations (``False`` leaves the epoch bar alone, Ignite's
            ``with_pbar_on_iters=False``).
        stream: where to draw (standard error by default); Ignite's ``file=`` is the same.
        desc: the label in front of the bar (Ignite's: ``"Epoch"``, ``"Iteration"`` for one epoch).
        bar_format: tqdm's format; Ignite's by default, ``None`` for tqdm's own.
        display: ``"auto"`` (by where ``stream`` goes), ``"bar"``, ``"widget"`` (a notebook's) or ``"lines"``.
        tqdm_kwargs: passed to ``tqdm.tqdm`` (``ncols``, ``ascii``, ...).

    Examples:
        >>> import io
        >>> from ember import Engine
        >>> from ember.handlers import ProgressBar
        >>> out = io.StringIO()
        >>> engine = Engine(lambda e, b: {"loss": b})
        >>> bar = ProgressBar(2, stream=out, display="bar", persist=True, mininterval=0,
        ...                   bar_format="{desc} {n}/{total}{postfix}")
        >>> _ = bar.attach(engine, output_keys=["loss"])
        >>> _ = engine.run([0.5, 0.25, 0.125, 0.0625])
        >>> [frame.strip() for frame in out.getvalue().split(chr(13)) if frame][-3:]  # the postfix lags one refresh
        ['Iteration:  2/4', 'Iteration:  4/4, loss=0.25', 'Iteration:  4/4, loss=0.0625']

        Written to a file (not a terminal), one line an epoch:

        >>> log = io.StringIO()
        >>> _ = ProgressBar(stream=log).attach(engine := Engine(lambda e, b: {"loss": b}), output_keys=["loss"])
        >>> _ = engine.run([0.5, 0.25], max_epochs=2)
        >>> print(log.getvalue(), end="")
        Epoch [1/2]: [2/2] 00:00, loss=0.25
        Epoch [2/2]: [2/2] 00:00, loss=0.25
    """

    _open: ClassVar[int] = 0  # bars currently drawn by this process, for nesting

    def __init__(
        self,
        refresh_every: int = 100,
        *,
        persist: bool = False,
        epoch_bar: bool = False,
        iteration_bar: bool = True,
        stream: TextIO | None = None,
        desc: str | None = None,
        bar_format: str | None = IGNITE_FORMAT,
        display: str = "auto",
        **tqdm_kwargs: Any,
    ) -> None:
        if isinstance(refresh_every, bool) or not isinstance(refresh_every, int) or refresh_every < 1:
            raise ValueError(f"`refresh_every` must be a positive int, got {refresh_every!r}.")
        if display not in CHOICES:
            raise ValueError(f"`display` must be one of {', '.join(map(repr, CHOICES))}; got {display!r}.")
        try:
            # the ignore below: imported to fail early when tqdm is missing
            import tqdm  # noqa: F401  # pyright: ignore[reportUnusedImport]
        except ImportError as e:  # pragma: no cover - tqdm comes with the progress extra
            raise ImportError(missing("ProgressBar", "tqdm", "progress")) from e
        if not (epoch_bar or iteration_bar):
            raise ValueError("ProgressBar(epoch_bar=False, iteration_bar=False) draws nothing; keep one of them.")
        if "file" in tqdm_kwargs:  # Ignite's name for the stream
            if stream is not None:
                raise ValueError("ProgressBar got both `stream` and `file`, which are the same; give one.")
            stream = tqdm_kwargs.pop("file")
        self.refresh_every, self.persist, self.epoch_bar = refresh_every, persist, epoch_bar
        self.iteration_bar = iteration_bar
        self.stream, self.desc, self.bar_format, self.tqdm_kwargs = stream, desc, bar_format, tqdm_kwargs
        self.display = display
        self._shown_as = "bar"
        self._began = 0.0  # when the epoch (or the rest of a resumed one) began, for a line's elapsed time
        self._bar: Any = None
        self._epochs: Any = None
        self._shown = 0
        self._fetched: dict[str, Any] = {}
        self._names: str | tuple[str, ...] = ()
        self._keys: str | tuple[str, ...] = ()
        self._attributes: tuple[str, ...] = ()
        self._transform: Callable[[Any], Any] | None = None
        self._unshown: set[str] = set()

    def log_message(self, message: str) -> None:
        r"""Write ``message`` on its own line above the bars (Ignite's; ``print`` would break the bar's line).

        Examples:
            >>> import io
            >>> from ember.handlers import ProgressBar
            >>> out = io.StringIO()
            >>> ProgressBar(stream=out).log_message("evaluating"); out.getvalue()
            'evaluating\n'
        """
        from tqdm import tqdm

        tqdm.write(message, file=self.stream)

    def _new_bar(self, total: int | None, desc: str, leave: bool, initial: int) -> Any:
        if self._shown_as == "widget":
            from tqdm.notebook import tqdm
        else:
            from tqdm import tqdm

        ProgressBar._open += 1
        return tqdm(
            total=total,
            initial=initial,
            desc=desc,
            leave=leave,
            position=ProgressBar._open - 1,
            file=self.stream,
            dynamic_ncols=self.stream is None,
            bar_format=self.bar_format,
            **self.tqdm_kwargs,
        )

    def _close(self, bar: Any) -> None:
        if bar is not None:
            bar.close()
            ProgressBar._open -= 1

    def _lines_to(self) -> TextIO:
        """Where lines go: the stream given, else standard error (standard output in a notebook: no red boxes)."""
        import sys

        return self.stream or (sys.stdout if in_a_notebook() else sys.stderr)

    def _label(self, engine: Engine) -> str:
        """Ignite's: ``Epoch [2/50]`` (``desc`` for ``Epoch``); a one-epoch run's is ``Iteration`` (or ``desc``)."""
        st = engine.state
        one = st.max_epochs == 1
        tag = self.desc if self.desc is not None else ("Iteration" if one else "Epoch")
        return tag if one or st.max_epochs is None else f"{tag} [{st.epoch}/{st.max_epochs}]"

    def _values(self, engine: Engine, output_keys: str | tuple[str, ...]) -> dict[str, Any]:
        values = pick(engine, self._names, output_keys, output_transform=self._transform)
        values.update((name, getattr(engine.state, name, None)) for name in self._attributes)
        return values

    def _started(self, engine: Engine) -> None:
        st = engine.state
        self._shown_as, self._began = shown_as(self.display, self.stream), time.monotonic()  # the stream may be new
        if self._shown_as == "lines":
            return
        if self.epoch_bar:
            total = st.max_epochs
            if total is None and st.max_iters is not None and st.epoch_length:  # a max_iters run: its epochs
                total = -(-st.max_iters // st.epoch_length)
            self._epochs = self._new_bar(total, "Epochs", leave=True, initial=st.epoch - _mid_epoch(engine))
        if self.iteration_bar and _mid_epoch(engine):  # resumed mid-epoch: no EPOCH_STARTED, the rest gets a bar
            self._epoch_started(engine)

    def _line(self, engine: Engine) -> None:
        """Lines instead of bars (a log file, a pipe): ``Epoch [2/5]: [64/64] 00:06, loss=0.123``, once an epoch."""
        from tqdm import tqdm

        st = engine.state
        values = self._values(engine, self._keys if st.output is not None else ())
        done = st.iteration - (st.epoch - 1) * st.epoch_length if st.epoch_length else st.iteration
        shown = ", ".join(
            f"{k}={v if isinstance(v, str) else tqdm.format_num(v)}" for k, v in postfix(values, self._unshown).items()
        )
        elapsed = tqdm.format_interval(time.monotonic() - self._began)
        line = f"{self._label(engine)}: [{done}/{st.epoch_length or '?'}] {elapsed}"
        print(line + (f", {shown}" if shown else ""), file=self._lines_to(), flush=True)

    def _epoch_started(self, engine: Engine) -> None:
        self._began = time.monotonic()
        if self._shown_as == "lines" or not self.iteration_bar:
            return
        st = engine.state
        nested = ProgressBar._open > (1 if self._epochs is not None else 0)
        label = f"{self._label(engine)}: "  # as Ignite's set_description labels it: "Epoch [2/50]: "
        self._shown = (st.iteration - (st.epoch - 1) * st.epoch_length) if st.epoch_length else 0
        self._bar = self._new_bar(st.epoch_length, label, self.persist and not nested, initial=self._shown)

    def _refresh(self, engine: Engine) -> None:
        if self._bar is None:
            return
        current = self._values(engine, self._keys)
        for v in current.values():
            start_host_copy(v)
        if self._fetched:
            self._bar.set_postfix(postfix(self._fetched, self._unshown), refresh=False)
        self._fetched = current
        self._advance(engine)

    def _advance(self, engine: Engine) -> None:
        st = engine.state
        done = st.iteration - (st.epoch - 1) * st.epoch_length if st.epoch_length else st.iteration
        self._bar.update(done - self._shown)
        self._shown = done

    def _epoch_completed(self, engine: Engine) -> None:
        if self._shown_as == "lines":
            self._line(engine)
            return
        shows = self._bar is not None or (self._epochs is not None and not self.iteration_bar)
        # The epoch's metrics are host numbers by now; the output is the epoch's last one.
        now = self._values(engine, self._keys if engine.state.output is not None else ()) if shows else {}
        if self._bar is not None:
            self._advance(engine)
            shown = {**self._fetched, **now}
            if shown:
                self._bar.set_postfix(postfix(shown, self._unshown), refresh=False)
            self._close(self._bar)
            self._bar, self._fetched = None, {}
        if self._epochs is not None:
            if not self.iteration_bar and now:  # the epoch bar alone shows the values (Ignite's bar over epochs)
                self._epochs.set_postfix(postfix(now, self._unshown), refresh=False)
            self._epochs.update(1)

    def _completed(self, *_: Any) -> None:
        self._close(self._bar)
        self._close(self._epochs)
        self._bar = self._epochs = None

    def attach(
        self,
        engine: Engine,
        metric_names: str | Sequence[str] | None = None,
        output_transform: Callable[[Any], Any] | None = None,
        event_name: Events | FilteredEvent | None = None,
        closing_event_name: Events = Events.EPOCH_COMPLETED,
        state_attributes: Sequence[str] | None = None,
        *,
        output_keys: str | Sequence[str] | None = None,
    ) -> RemovableEventHandle:
        """Draw bars for ``engine``, showing ``metric_names`` (or ``"all"``), scalar ``output_keys`` and more.

        Ignite's arguments: ``output_transform`` names values of its own from the output (a mapping such as
        ``lambda out: {"batchloss": out["loss"]}``, or one value, shown as ``output``); ``event_name`` is when the bar
        moves (``Events.ITERATION_COMPLETED(every=refresh_every)`` by default); ``closing_event_name`` ends each
        epoch's bar (``EPOCH_COMPLETED``), or, with ``event_name=Events.EPOCH_COMPLETED`` and
        ``closing_event_name=Events.COMPLETED``, one bar over the epochs is drawn (``epoch_bar=True,
        iteration_bar=False``); ``state_attributes`` adds ``engine.state`` attributes by name. Returns one handle
        whose ``remove()`` takes the bars away (Ignite's ``attach`` returns ``None``; code written for it is
        unaffected). Only process 0 of a multi-process run draws; elsewhere the handle removes nothing. A bar attached
        where one of the same kind (iteration bar, epoch bar) is attached already replaces it, with a warning: a
        notebook cell run again does not draw every bar twice.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import ProgressBar
            >>> handle = ProgressBar().attach(Engine(lambda e, b: b), metric_names="all")
            >>> handle.remove()
        """
        self._names = check_names("metric_names", metric_names)
        self._keys = check_names("output_keys", output_keys)
        self._transform = check_transform(output_transform)
        self._attributes = _attribute_names(state_attributes)
        moves = self._moves(event_name, closing_event_name)
        shown = shown_as(self.display, self.stream)  # a widget that cannot be drawn is said here, at attach
        own = self.stream in (None, sys.stdout, sys.stderr)  # the notebook's output, not a file of the user's
        if shown == "lines" and self.display == "auto" and own and in_a_notebook():
            warnings.warn(
                "ProgressBar: this notebook has no ipywidgets, so progress is one line an epoch; for a bar, "
                "install ember's `notebook` extra (pip install ipywidgets) and restart the kernel.",
                UserWarning,
                stacklevel=2,
            )
        kind = ("ProgressBar", self.epoch_bar, self.iteration_bar)  # one bar of each kind per engine
        with collect_handles() as made:
            replaced = "ProgressBar: this engine's bar of the same kind is replaced by this one (a cell run again?)."
            hold(engine, kind, self, made, refuse=False, if_held=replaced)
            if is_primary_process():
                engine.add_event_handler(Events.STARTED, self._started)
                engine.add_event_handler(Events.EPOCH_STARTED, self._epoch_started)
                if self.iteration_bar:
                    engine.add_event_handler(moves, self._refresh)
                engine.add_event_handler(Events.EPOCH_COMPLETED, self._epoch_completed)
                engine.add_event_handler(Events.COMPLETED | Events.EXCEPTION_RAISED | Events.TERMINATE, self._completed)
        return made.handle

    def _moves(self, event_name: Events | FilteredEvent | None, closing: Events) -> Events | FilteredEvent:
        """The event the iteration bar moves on; Ignite's bar over the epochs turns this bar into one."""
        if event_name is None:
            event_name = Events.ITERATION_COMPLETED(every=self.refresh_every)
        base = event_name.event if isinstance(event_name, FilteredEvent) else event_name
        if base is Events.EPOCH_COMPLETED and closing is Events.COMPLETED:
            self.epoch_bar, self.iteration_bar = True, False
            return event_name
        if base not in (Events.ITERATION_STARTED, Events.ITERATION_COMPLETED) or closing is not Events.EPOCH_COMPLETED:
            raise ValueError(
                "ProgressBar moves on ITERATION_STARTED or ITERATION_COMPLETED (filtered or not) and closes at "
                "EPOCH_COMPLETED, or moves at EPOCH_COMPLETED and closes at COMPLETED (a bar over the epochs); got "
                f"event_name={event_name!r}, closing_event_name={closing!r}."
            )
        return event_name


def _mid_epoch(engine: Engine) -> bool:
    """Whether ``engine`` stands inside an epoch that EPOCH_STARTED will not announce again (a mid-epoch resume)."""
    st = engine.state
    return bool(st.epoch_length) and (st.epoch - 1) * st.epoch_length <= st.iteration < st.epoch * st.epoch_length


def _attribute_names(state_attributes: Sequence[str] | None) -> tuple[str, ...]:
    """``state_attributes`` as a tuple of names; a ``TypeError`` naming it otherwise."""
    if state_attributes is None:
        return ()
    if isinstance(state_attributes, str) or not all(isinstance(a, str) for a in state_attributes):
        raise TypeError(f"`state_attributes` must be a sequence of state attribute names, got {state_attributes!r}.")
    return tuple(state_attributes)
