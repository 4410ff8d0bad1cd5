"""Which run a fast tier's folder belongs to: two runs given the same fast folder never read each other's checkpoints.

A `TieredStore` writes ``tier-of.json`` into its fast folder, naming its durable tier. A store whose durable tier is
another finds the folder taken: it warns, reads none of the checkpoints there, and keeps its own in a subfolder
named after its durable tier, which its relaunches find again. `tier_roots` checks a `TieredStore`'s folders first.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

from ember._atomic_file import replace_file
from ember.checkpoint._store import CheckpointStore

#: The file in a fast tier's folder that names the durable tier it belongs to.
OWNER = "tier-of.json"


def owned_fast_root(fast_root: Path, durable_root: Path) -> Path:
    """The folder of the fast tier whose durable tier is ``durable_root``: ``fast_root`` unless another run owns it.

    A folder that names no owner yet (new, or written before owners were named) becomes this run's.

    Examples:
        >>> import tempfile, warnings
        >>> from pathlib import Path
        >>> from ember.checkpoint._fast_owner import owned_fast_root
        >>> fast = Path(tempfile.mkdtemp())
        >>> owned_fast_root(fast, Path("/runs/a")) == fast
        True
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     other = owned_fast_root(fast, Path("/runs/b"))
        >>> other.parent == fast, other.name.startswith("of-b-"), len(caught)
        (True, True, 1)
    """
    marker = fast_root / OWNER
    try:
        owner = json.loads(marker.read_text())["durable"]
    except FileNotFoundError:
        owner = None
    except (OSError, ValueError, KeyError, TypeError) as e:  # altered, truncated: whose it is cannot be known
        owner = f"unknown ({OWNER} cannot be read: {e})"
    if owner is None:
        fast_root.mkdir(parents=True, exist_ok=True)
        replace_file(fast_root, OWNER, json.dumps({"durable": str(durable_root)}))
        return fast_root
    if owner == str(durable_root):
        return fast_root
    own = fast_root / f"of-{durable_root.name}-{hashlib.sha256(str(durable_root).encode()).hexdigest()[:8]}"
    warnings.warn(
        f"The fast folder {fast_root} holds the fast checkpoints of another run (durable tier {owner}); they are "
        f"not read. This run's fast checkpoints go into {own}.",
        RuntimeWarning,
        stacklevel=3,
    )
    return owned_fast_root(own, durable_root)


def tier_roots(fast: object, durable: object, *, durable_every: object, keep_fast: object) -> tuple[Path, Path]:
    """A `TieredStore`'s arguments checked; its two tiers' folders, absolute (each a clear error if wrong)."""
    for label, value in (("durable_every", durable_every), ("keep_fast", keep_fast)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"`{label}` must be a positive int, got {value!r}.")
    if not isinstance(fast, str | os.PathLike):
        raise TypeError(f"`fast` must be a folder (a str or a path), got {type(fast).__name__}.")
    for label, given in (("fast", fast), ("durable", durable)):
        if isinstance(given, str | os.PathLike) and not os.fspath(given).strip():
            raise ValueError(f"`{label}` must name a folder, got {os.fspath(given)!r} (the working folder?).")
        if isinstance(given, str | os.PathLike) and os.path.exists(given) and not os.path.isdir(given):
            raise ValueError(f"`{label}` must be a folder, got {os.fspath(given)!r}, which is a file.")
    if not isinstance(durable, CheckpointStore | str | os.PathLike):
        raise TypeError(
            f"`durable` must be a folder, a CheckpointStore or an OrbaxStore, got {type(durable).__name__}."
        )
    fast_root = Path(os.path.abspath(fast))
    durable_root = durable.root if isinstance(durable, CheckpointStore) else Path(os.path.abspath(durable))
    if fast_root == durable_root or durable_root in fast_root.parents or fast_root in durable_root.parents:
        raise ValueError(
            f"`fast` and `durable` must be separate folders, neither inside the other; got {str(fast_root)!r} "
            f"and {str(durable_root)!r}."
        )
    return fast_root, durable_root
