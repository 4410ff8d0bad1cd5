"""`OneStepLate`: read a device value one firing after it was computed, so reading never stalls."""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.writers._async import start_host_copy


class OneStepLate:
    """Holds the device value pushed last; pushing the next one returns the previous one as host numbers.

    The previous value's copy to the host started when it was pushed, and a whole step ran since, so
    reading it does not wait on the accelerator.
    """

    def __init__(self) -> None:
        self._pending: tuple[int, Any] | None = None

    def push(self, iteration: int, value: Any) -> tuple[int, Any] | None:
        """Keep ``value`` (computed at ``iteration``); return the previous ``(iteration, host value)``."""
        start_host_copy(value)
        previous, self._pending = self._pending, (iteration, value)
        return None if previous is None else (previous[0], np.asarray(previous[1]))

    def drain(self) -> tuple[int, Any] | None:
        """Return the value still held (at the end of a run) and forget it."""
        previous, self._pending = self._pending, None
        return None if previous is None else (previous[0], np.asarray(previous[1]))
