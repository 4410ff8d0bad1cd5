"""`Progress`: where a run stands in its epochs, beyond the counters in `State`: the loop's own bookkeeping."""

from __future__ import annotations

from ember.engine._state import State


class Progress:
    """Whether an epoch is open, how far into it the run is, and what a resumed run still owes.

    ``State`` holds the counters users read (``epoch``, ``iteration``); this holds what the loop and a checkpoint
    need besides: an epoch started and not completed, the iterations done in it, an EPOCH_COMPLETED still owed (a
    checkpoint taken while it was cut short), data that ran out, and a position just loaded.

    Attributes:
        epoch_open: an epoch has started and not yet completed.
        epoch_pos: iterations done in the current epoch.
        epoch_owed: ``mark_epoch_incomplete()`` was called in the last EPOCH_COMPLETED.
        exhausted: the data ran out before the run's end.
        loaded: the position came from ``load_state_dict``, and no run has started since.

    Examples:
        >>> from ember.engine._progress import Progress
        >>> from ember.engine._state import State
        >>> state, progress = State(), Progress()
        >>> state.iteration, state.epoch_length = 5, 3
        >>> progress.place(state, epoch_completed=None); state.epoch, progress.epoch_open, progress.epoch_pos
        (2, True, 2)
    """

    __slots__ = ("epoch_open", "epoch_owed", "epoch_pos", "exhausted", "loaded")

    def __init__(self) -> None:
        self.epoch_open = False
        self.epoch_pos = 0
        self.epoch_owed = False
        self.exhausted = False
        self.loaded = False

    def restart(self) -> None:
        """A new run: no epoch open, nothing owed."""
        self.epoch_open, self.epoch_pos, self.epoch_owed = False, 0, False

    def start_epoch(self) -> None:
        """An epoch starts."""
        self.epoch_open, self.epoch_owed, self.epoch_pos = True, False, 0

    def completion_pending(self, state: State) -> bool:
        """The current epoch's last iteration ran, but a terminate() kept EPOCH_COMPLETED from firing."""
        length = state.epoch_length
        return self.epoch_open and length is not None and self.epoch_pos >= length

    def done(self, state: State) -> bool:
        """Whether the run has reached its end (``max_iters``, or ``max_epochs``) with every EPOCH_COMPLETED fired."""
        if self.completion_pending(state):
            return False  # the epoch still owes its EPOCH_COMPLETED (a stop at its last iteration)
        if state.max_iters is not None and state.iteration >= state.max_iters:
            return True
        if state.max_epochs is None:
            return False
        if state.epoch - self.epoch_open >= state.max_epochs:
            return True
        return state.epoch_length is not None and state.iteration >= state.epoch_length * state.max_epochs

    def place(self, state: State, *, epoch_completed: bool | None) -> None:
        """Set ``state.epoch`` and the epoch's position from a loaded ``state.iteration``.

        ``epoch_completed=False`` (a checkpoint taken at an epoch's end before its EPOCH_COMPLETED finished) leaves
        that epoch open, so a resumed run fires its EPOCH_COMPLETED first.
        """
        self.loaded, self.epoch_owed = True, False
        length = state.epoch_length
        full, pos = divmod(state.iteration, length) if length else (0, 0)
        if epoch_completed is False and length and pos == 0 and full > 0:
            full, pos = full - 1, length  # the last epoch's EPOCH_COMPLETED is still owed
        self.epoch_open, self.epoch_pos = pos > 0, pos
        state.epoch = full + (pos > 0)
