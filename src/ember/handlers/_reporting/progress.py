"""`ProgressBar`: tqdm bars for epochs and iterations, refreshed from values already on the host."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TextIO

import numpy as np

from ember._extras import missing
from ember.engine import Engine, Events, RemovableEventHandle, collect_handles
from ember.handlers._reporting.values import check_names, check_transform, pick
from ember.writers import is_primary_process
from ember.writers._async import start_host_copy


def _postfix(values: dict[str, Any]) -> dict[str, str]:
    return {k: f"{float(np.asarray(v)):.4g}" for k, v in values.items()}


class ProgressBar:
    """An iteration bar per epoch (and optionally an epoch bar), with the loss and metrics in the postfix.

    Needs tqdm: ``pip install -e ".[progress]"``. The bar moves every ``refresh_every`` iterations. Its postfix
    shows values fetched at the previous refresh: at each refresh the current values start copying to the host and
    the ones started last time are displayed, so the bar never waits for the device. At EPOCH_COMPLETED the epoch's
    metrics (already host numbers) are shown. Totals come from ``epoch_length``; data of unknown length gets a bar
    without a total or ETA. A bar attached to an evaluator while the trainer's is open is drawn below it and removed
    when the evaluation ends. Only the primary process draws.

    Args:
        refresh_every: iterations between refreshes.
        persist: keep each epoch's finished bar on screen.
        epoch_bar: also draw a bar over the epochs.
        iteration_bar: draw the bar over each epoch's iterations (``False`` leaves the epoch bar alone, Ignite's
            ``with_pbar_on_iters=False``).
        stream: where to draw (standard error by default).
        desc: the label in front of the bar (``"Epoch"`` by default).
        tqdm_kwargs: passed to ``tqdm.tqdm`` (``ncols``, ``ascii``, ...).

    Examples:
        >>> import io
        >>> from ember import Engine
        >>> from ember.handlers import ProgressBar
        >>> out = io.StringIO()
        >>> engine = Engine(lambda e, b: {"loss": b})
        >>> bar = ProgressBar(2, stream=out, persist=True, mininterval=0, bar_format="{desc} {n}/{total}{postfix}")
        >>> _ = bar.attach(engine, output_keys=["loss"])
        >>> _ = engine.run([0.5, 0.25, 0.125, 0.0625])
        >>> [frame.strip() for frame in out.getvalue().split(chr(13)) if frame][-3:]  # the postfix lags one refresh
        ['Epoch [1/1] 2/4', 'Epoch [1/1] 4/4, loss=0.25', 'Epoch [1/1] 4/4, loss=0.0625']
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
        desc: str = "Epoch",
        **tqdm_kwargs: Any,
    ) -> None:
        if isinstance(refresh_every, bool) or not isinstance(refresh_every, int) or refresh_every < 1:
            raise ValueError(f"`refresh_every` must be a positive int, got {refresh_every!r}.")
        try:
            # the ignore below: imported to fail early when tqdm is missing
            import tqdm  # noqa: F401  # pyright: ignore[reportUnusedImport]
        except ImportError as e:  # pragma: no cover - tqdm comes with the progress extra
            raise ImportError(missing("ProgressBar", "tqdm", "progress")) from e
        if not (epoch_bar or iteration_bar):
            raise ValueError("ProgressBar(epoch_bar=False, iteration_bar=False) draws nothing; keep one of them.")
        self.refresh_every, self.persist, self.epoch_bar = refresh_every, persist, epoch_bar
        self.iteration_bar = iteration_bar
        self.stream, self.desc, self.tqdm_kwargs = stream, desc, tqdm_kwargs
        self._bar: Any = None
        self._epochs: Any = None
        self._shown = 0
        self._fetched: dict[str, Any] = {}
        self._names: str | tuple[str, ...] = ()
        self._keys: str | tuple[str, ...] = ()
        self._transform: Callable[[Any], Any] | None = None

    def _new_bar(self, total: int | None, desc: str, leave: bool) -> Any:
        from tqdm import tqdm

        ProgressBar._open += 1
        return tqdm(
            total=total,
            desc=desc,
            leave=leave,
            position=ProgressBar._open - 1,
            file=self.stream,
            dynamic_ncols=self.stream is None,
            **self.tqdm_kwargs,
        )

    def _close(self, bar: Any) -> None:
        if bar is not None:
            bar.close()
            ProgressBar._open -= 1

    def _started(self, engine: Engine) -> None:
        if self.epoch_bar:
            st = engine.state
            total = st.max_epochs
            if total is None and st.max_iters is not None and st.epoch_length:  # a max_iters run: its epochs
                total = -(-st.max_iters // st.epoch_length)
            self._epochs = self._new_bar(total, "Epochs", leave=True)
            self._epochs.update(engine.state.epoch)

    def _epoch_started(self, engine: Engine) -> None:
        st = engine.state
        max_epochs = f"/{st.max_epochs}" if st.max_epochs is not None else ""
        nested = ProgressBar._open > (1 if self._epochs is not None else 0)
        self._bar = self._new_bar(st.epoch_length, f"{self.desc} [{st.epoch}{max_epochs}]", self.persist and not nested)
        self._shown = (st.iteration - (st.epoch - 1) * st.epoch_length) if st.epoch_length else 0
        self._bar.update(self._shown)

    def _refresh(self, engine: Engine) -> None:
        if self._bar is None:
            return
        current = pick(engine, self._names, self._keys, output_transform=self._transform)
        for v in current.values():
            start_host_copy(v)
        if self._fetched:
            self._bar.set_postfix(_postfix(self._fetched), refresh=False)
        self._fetched = current
        self._advance(engine)

    def _advance(self, engine: Engine) -> None:
        st = engine.state
        done = st.iteration - (st.epoch - 1) * st.epoch_length if st.epoch_length else st.iteration
        self._bar.update(done - self._shown)
        self._shown = done

    def _epoch_completed(self, engine: Engine) -> None:
        if self._bar is not None:
            self._advance(engine)
            # The epoch's metrics are host numbers by now; the output is the epoch's last one.
            has_output = engine.state.output is not None
            now = pick(engine, self._names, self._keys if has_output else (), output_transform=self._transform)
            shown = {**self._fetched, **now}
            if shown:
                self._bar.set_postfix(_postfix(shown), refresh=False)
            self._close(self._bar)
            self._bar, self._fetched = None, {}
        if self._epochs is not None:
            self._epochs.update(1)

    def _completed(self, *_: Any) -> None:
        self._close(self._bar)
        self._close(self._epochs)
        self._bar = self._epochs = None

    def attach(
        self,
        engine: Engine,
        metric_names: str | Sequence[str] | None = None,
        output_keys: str | Sequence[str] | None = None,
        output_transform: Callable[[Any], Any] | None = None,
    ) -> RemovableEventHandle:
        """Draw bars for ``engine``, showing ``metric_names`` (or ``"all"``) and scalar ``output_keys``.

        ``output_transform`` (Ignite's) names values of its own from the output: a mapping such as
        ``lambda out: {"batchloss": out["loss"]}``, or one value, shown as ``output``. Returns one handle whose
        ``remove()`` takes the bars away (Ignite's ``attach`` returns ``None``; code written for it is unaffected).
        Only process 0 of a multi-process run draws; elsewhere the handle removes nothing.

        Examples:
            >>> from ember import Engine
            >>> from ember.handlers import ProgressBar
            >>> handle = ProgressBar().attach(Engine(lambda e, b: b), metric_names="all")
            >>> handle.remove()
        """
        self._names = check_names("metric_names", metric_names)
        self._keys = check_names("output_keys", output_keys)
        self._transform = check_transform(output_transform)
        with collect_handles() as made:
            if is_primary_process():
                engine.add_event_handler(Events.STARTED, self._started)
                if self.iteration_bar:
                    engine.add_event_handler(Events.EPOCH_STARTED, self._epoch_started)
                    engine.add_event_handler(Events.ITERATION_COMPLETED(every=self.refresh_every), self._refresh)
                engine.add_event_handler(Events.EPOCH_COMPLETED, self._epoch_completed)
                engine.add_event_handler(Events.COMPLETED | Events.EXCEPTION_RAISED | Events.TERMINATE, self._completed)
        return made.handle
