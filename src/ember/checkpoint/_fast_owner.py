"""Whose a fast tier's folder is: each durable tier's fast checkpoints in a folder of their own, named after it.

A durable tier holds an id of its own (``.tier-id``, made at its first use); a `TieredStore` keeps its fast checkpoints
in ``<fast>/<durable folder's name>-<id>``. Two runs given one fast folder never read each other's checkpoints, a
relaunch finds its own again, and a run whose durable folder was made anew (deleted, then the same path given again)
starts a fast folder of its own instead of resuming the old run's. `fast_root_of` checks a `TieredStore`'s arguments
first.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
import warnings
from pathlib import Path

from ember._atomic_file import replace_file
from ember.checkpoint._store import CheckpointStore

#: The file in a durable tier's folder that holds its id (the name of its fast tiers' folder ends with it).
TIER_ID = ".tier-id"


def durable_id(durable_root: Path) -> str:
    """The id of the durable tier in ``durable_root``: read from its `TIER_ID` file, or made there (16 hex digits).

    A file that does not hold an id (altered, truncated), or none beside checkpoints (deleted), is replaced with a new
    one, with a warning: the fast checkpoints kept under the old one are not read (the durable tier's are).

    Examples:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from ember.checkpoint._fast_owner import durable_id
        >>> durable = Path(tempfile.mkdtemp())
        >>> made = durable_id(durable)
        >>> len(made), durable_id(durable) == made
        (16, True)
    """
    try:
        text = (durable_root / TIER_ID).read_bytes().decode("ascii", "replace")  # altered bytes: not an id
        if re.fullmatch(r"[0-9a-f]{16}", text):
            return text
        warnings.warn(
            f"{durable_root / TIER_ID} does not hold a durable tier's id ({text[:40]!r}); a new one is made, and the "
            "fast checkpoints kept under the old one are not read.",
            RuntimeWarning,
            stacklevel=3,
        )
    except FileNotFoundError:
        if durable_root.is_dir() and any(p.is_dir() and not p.name.startswith(".") for p in durable_root.iterdir()):
            warnings.warn(
                f"{durable_root} holds checkpoints but no {TIER_ID} (deleted, or written before tiers were named); a "
                "new one is made, and the fast checkpoints kept for it before are not read.",
                RuntimeWarning,
                stacklevel=3,
            )
    made = secrets.token_hex(8)
    durable_root.mkdir(parents=True, exist_ok=True)
    replace_file(durable_root, TIER_ID, made)
    return made


def fast_folder(label: str, fast: str | os.PathLike[str], apart: dict[str, Path]) -> Path:
    """``fast``, absolute, once it is a folder this process can write, apart from each of ``apart``'s folders.

    The one check of a fast tier's folder (`TieredStore`'s ``fast``, ``ember train``'s ``fast_dir``): a file, a path
    under a file, a folder that cannot be written, or one equal to, inside or holding a folder of ``apart`` (the
    durable tier, the run folder) is refused with one line naming ``label`` (as it is shown), the path and the rule.

    Examples:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from ember.checkpoint._fast_owner import fast_folder
        >>> durable = Path(tempfile.mkdtemp())
        >>> fast_folder("`fast`", durable / "shm", {"`durable`": durable})
        Traceback (most recent call last):
        ValueError: `fast` and `durable` must be separate folders, neither inside the other; got ...
    """
    root = Path(os.path.abspath(fast))
    for other_label, other in apart.items():
        if root == other or other in root.parents or root in other.parents:
            raise ValueError(
                f"{label} and {other_label} must be separate folders, neither inside the other; got {str(root)!r} "
                f"and {str(other)!r}."
            )
    above = next(p for p in (root, *root.parents) if os.path.lexists(p))
    if not above.is_dir():
        where = "which is a file" if above == root else f"under {str(above)!r}, which is a file"
        raise ValueError(f"{label} must be a folder, got {os.fspath(fast)!r}, {where}.")
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root):
            pass
    except OSError as e:
        raise ValueError(
            f"{label} must be a folder this process can write, got {os.fspath(fast)!r} ({e.strerror})."
        ) from None
    return root


def fast_root_of(fast: object, durable: object, *, durable_every: object, keep_fast: object) -> Path:
    """A `TieredStore`'s arguments checked (each a clear error if wrong); its fast folder, absolute."""
    for label, value in (("durable_every", durable_every), ("keep_fast", keep_fast)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"`{label}` must be a positive int, got {value!r}.")
    if not isinstance(fast, str | os.PathLike):
        raise TypeError(f"`fast` must be a folder (a str or a path), got {type(fast).__name__}.")
    for label, given in (("fast", fast), ("durable", durable)):
        if isinstance(given, str | os.PathLike) and not os.fspath(given).strip():
            raise ValueError(f"`{label}` must name a folder, got {os.fspath(given)!r} (the working folder?).")
    if isinstance(durable, str | os.PathLike) and os.path.exists(durable) and not os.path.isdir(durable):
        raise ValueError(f"`durable` must be a folder, got {os.fspath(durable)!r}, which is a file.")
    if not isinstance(durable, CheckpointStore | str | os.PathLike):
        raise TypeError(
            f"`durable` must be a folder, a CheckpointStore or an OrbaxStore, got {type(durable).__name__}."
        )
    durable_root = durable.root if isinstance(durable, CheckpointStore) else Path(os.path.abspath(durable))
    return fast_folder("`fast`", fast, {"`durable`": durable_root})
