"""`Ledger`: which checkpoints a `Checkpoint` handler keeps, decided before anything is written (Ignite's rule).

Ignite keeps a list of ``(priority, filename)`` items sorted by priority (the score, else the global step;
ties in the order they were saved). A new checkpoint is saved only while fewer than ``n_saved`` are kept
or when its priority beats the lowest (``>`` it, or ``>=`` with ``greater_or_equal``); the lowest then
goes. The ledger keeps that list for ember's stores and for users' save handlers alike, and adds ember's
policies on top: ``keep_every`` pins checkpoints whose step is a multiple (never removed, still counted
among the kept); ``keep_while`` holds a checkpoint, whatever the ranking, while it says so (it goes at the first
save after). A save that fails puts the ledger back (`failures`).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple


class Item(NamedTuple):
    """One kept checkpoint as Ignite records it: its ``priority`` (higher is better) and its ``filename``."""

    priority: float
    filename: str


@dataclass(frozen=True)
class Entry:
    """One kept checkpoint: its name, step, priority, and when it was saved (``order``, older first)."""

    filename: str
    step: int
    priority: float
    order: int


class Ledger:
    """The checkpoints one handler keeps, and the decisions Ignite's ``Checkpoint`` makes about a new one.

    Args:
        n_saved: how many are kept: the highest priorities (``None``: all).
        mode: ``"max"`` or ``"min"``: which priorities are best.
        keep_every: a checkpoint whose step is a multiple of it is never removed, though it counts among the kept.
        greater_or_equal: a new checkpoint whose priority equals the lowest kept one's is saved (and the older
            one goes); by default it is not, as in Ignite.
        keep_while: ``keep_while(step)``: a checkpoint of ``step`` is not removed while it is true; asked again at
            every save. It does not change which checkpoints are saved.

    Examples:
        >>> from ember.handlers._checkpointing.retention import Ledger
        >>> ledger = Ledger(n_saved=2, mode="max")
        >>> for step, score in ((1, 0.5), (2, 0.9), (3, 0.7), (4, 0.6)):
        ...     if ledger.admits(step, score):
        ...         removed = ledger.add(f"step_{step}", step, score)
        ...         print(step, "saved, removes", [e.filename for e in removed])
        ...     else:
        ...         print(step, "not saved")
        1 saved, removes []
        2 saved, removes []
        3 saved, removes ['step_1']
        4 not saved
        >>> ledger.saved()
        [Item(priority=0.7, filename='step_3'), Item(priority=0.9, filename='step_2')]
    """

    def __init__(
        self,
        *,
        n_saved: int | None,
        mode: Literal["min", "max"],
        keep_every: int | None = None,
        greater_or_equal: bool = False,
        keep_while: Callable[[int], bool] | None = None,
    ) -> None:
        self.n_saved, self.sign = n_saved, 1.0 if mode == "max" else -1.0
        self.keep_every, self.held = keep_every, keep_while
        self.pins = keep_every is not None or keep_while is not None  # the steps matter: listed in the state dict
        self.greater_or_equal = greater_or_equal
        self.entries: list[Entry] = []
        self._order = 0
        self._before: tuple[list[Entry], int] | None = None  # as it was before the save in flight (`begin`)

    def _pinned(self, step: int) -> bool:
        return self.keep_every is not None and step % self.keep_every == 0

    def _key(self, e: Entry) -> tuple[float, int]:
        return self.sign * e.priority, e.order

    def _top(self, entries: list[Entry]) -> list[Entry]:
        return entries if self.n_saved is None else sorted(entries, key=self._key)[-self.n_saved :]

    def admits(self, step: int, priority: float, *, replacing: str | None = None) -> bool:
        """Whether a checkpoint of ``step`` and ``priority`` is saved: pinned, or among the ``n_saved`` kept.

        A new checkpoint ties below the kept ones unless ``greater_or_equal`` (Ignite's ``>`` against ``>=``).
        ``replacing`` names a kept checkpoint the new one takes the place of (the same step saved again): it
        does not compete.
        """
        if self.n_saved is None or self._pinned(step):
            return True
        order = self._order if self.greater_or_equal else -1
        new = Entry("", step, priority, order)
        others = [e for e in self.entries if e.filename != replacing]
        return new in self._top([*others, new])

    def forget(self, filename: str) -> None:
        """Drop a kept checkpoint from the record (it was replaced), without returning it for removal."""
        self.entries = [e for e in self.entries if e.filename != filename]

    def add(self, filename: str, step: int, priority: float) -> list[Entry]:
        """Record a saved checkpoint; return the kept ones it pushes out (one of the same name is just replaced)."""
        self.entries = [e for e in self.entries if e.filename != filename]
        self.entries.append(Entry(filename, step, priority, self._order))
        self._order += 1
        kept = {e.filename for e in self._top(self.entries)} | {
            e.filename for e in self.entries if self._pinned(e.step)
        }
        if self.held is not None:
            kept |= {e.filename for e in self.entries if e.filename not in kept and self.held(e.step)}
        removed = [e for e in self.entries if e.filename not in kept]
        self.entries = [e for e in self.entries if e.filename in kept]
        return removed

    def seed(self, found: Sequence[tuple[str, int, float]]) -> None:
        """Start from checkpoints found on disk (``(filename, step, priority)``, oldest first), without removing any."""
        for filename, step, priority in found:
            self.entries.append(Entry(filename, step, priority, self._order))
            self._order += 1

    def saved(self) -> list[Item]:
        """The kept checkpoints as Ignite lists them: lowest priority first, ties oldest first."""
        return [Item(e.priority, e.filename) for e in sorted(self.entries, key=lambda e: (e.priority, e.order))]

    def best(self) -> Entry | None:
        """The checkpoint Ignite's ``last_checkpoint`` names: the highest priority, the newest among ties."""
        return max(self.entries, key=self._key) if self.entries else None

    def snapshot(self) -> tuple[list[Entry], int]:
        """What `restore` puts back: a save that failed leaves the ledger as it was."""
        return list(self.entries), self._order

    def restore(self, snapshot: tuple[list[Entry], int]) -> None:
        """Put back a `snapshot`."""
        self.entries, self._order = list(snapshot[0]), snapshot[1]

    def begin(self) -> None:
        """A save starts: `roll_back` puts the ledger back as it is now, until the save is `settle`d."""
        self._before = self.snapshot()

    def settle(self) -> None:
        """The save in flight is on disk: nothing is put back any more."""
        self._before = None

    def roll_back(self) -> None:
        """The save in flight failed: the ledger is as it was when it began (nothing if none is in flight)."""
        if self._before is not None:
            self.restore(self._before)
            self._before = None

    def state_dict(self) -> dict[str, Any]:
        """Ignite's ``Checkpoint.state_dict()``: ``{"_saved": [(priority, filename), ...]}``.

        With ``keep_every``, whose pins go by step, ``"steps"`` lists the steps too where a priority is not its step
        (a score); otherwise the state dict is Ignite's exactly.

        Examples:
            >>> from ember.handlers._checkpointing.retention import Ledger
            >>> ledger = Ledger(n_saved=None, mode="max")
            >>> _ = ledger.add("step_6-acc=0.9000", 6, 0.9)
            >>> ledger.state_dict()
            {'_saved': [(0.9, 'step_6-acc=0.9000')]}
            >>> pinning = Ledger(n_saved=None, mode="max", keep_every=2)
            >>> _ = pinning.add("step_6-acc=0.9000", 6, 0.9)
            >>> pinning.state_dict()
            {'_saved': [(0.9, 'step_6-acc=0.9000')], 'steps': [6]}
        """
        entries = sorted(self.entries, key=lambda e: (e.priority, e.order))
        state: dict[str, Any] = {"_saved": [(e.priority, e.filename) for e in entries]}
        if self.pins and any(e.step != _as_step(e.priority) for e in entries):
            state["steps"] = [e.step for e in entries]
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Take Ignite's ``{"_saved": [(priority, filename), ...]}`` (ember's adds ``"steps"`` to pin by step)."""
        if not isinstance(state_dict, Mapping) or "_saved" not in state_dict:
            raise ValueError(f"A Checkpoint's state_dict must hold '_saved'; got {state_dict!r}.")
        saved = [tuple(item) for item in state_dict["_saved"]]
        steps = list(state_dict.get("steps", [_as_step(p) for p, _ in saved]))
        if len(steps) != len(saved):
            raise ValueError(f"A Checkpoint's state_dict lists {len(saved)} checkpoints but {len(steps)} steps.")
        self.entries, self._order = [], 0
        self.seed([(str(f), int(s), p) for (p, f), s in zip(saved, steps, strict=True)])


@contextlib.contextmanager
def failures(on_error: Literal["raise", "warn"], ledger: Ledger) -> Generator[None]:
    """Let a failed write raise, or with ``on_error="warn"`` turn it into a warning; the ledger is put back."""
    try:
        yield
    except OSError as e:
        ledger.roll_back()
        if on_error == "raise":
            raise
        warnings.warn(
            f"A checkpoint could not be written ({type(e).__name__}: {e}); training goes on, and the "
            "earlier checkpoints are intact.",
            RuntimeWarning,
            stacklevel=3,
        )


def _as_step(priority: Any) -> int:
    """Ignite's state_dict has no steps: an integral priority was one (unscored); else no step is known (-1)."""
    return int(priority) if isinstance(priority, int) or (isinstance(priority, float) and priority.is_integer()) else -1


def priority_text(priority: float) -> str:
    """A priority as Ignite writes it in a file name: an integer as is, anything else with 4 decimals.

    Examples:
        >>> from ember.handlers._checkpointing.retention import priority_text
        >>> priority_text(400), priority_text(0.97312), priority_text(float("inf"))
        ('400', '0.9731', 'inf')
    """
    if isinstance(priority, int) and not isinstance(priority, bool):
        return f"{priority}"
    return f"{priority:.4f}" if math.isfinite(priority) else f"{priority}"
