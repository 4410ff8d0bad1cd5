"""Arguments renamed to Ignite's names: the old name still works for one release, with a warning."""

from __future__ import annotations

import warnings
from typing import Any


def renamed(owner: str, old: str, old_value: Any, new: str, new_value: Any) -> Any:
    """``new_value``, or ``old_value`` (with a ``DeprecationWarning``) when the caller used the old name.

    Examples:
        >>> import warnings
        >>> from ember.handlers._renamed import renamed
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     value = renamed("EarlyStopping", "min_delta", 0.1, "threshold", 0.0)
        >>> value
        0.1
        >>> print(caught[0].message)
        EarlyStopping(min_delta=...) is deprecated: use threshold=, Ignite's name; min_delta goes in the next release.
    """
    if old_value is None:
        return new_value
    warnings.warn(
        f"{owner}({old}=...) is deprecated: use {new}=, Ignite's name; {old} goes in the next release.",
        DeprecationWarning,
        stacklevel=3,
    )
    return old_value
