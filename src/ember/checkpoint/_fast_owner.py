"""Which run a fast tier's folder belongs to: two runs given the same fast folder never read each other's checkpoints.

A `TieredStore` writes ``tier-of.json`` into its fast folder, naming its durable tier. A store whose durable tier is
another finds the folder taken: it warns, reads none of the checkpoints there, and keeps its own in a subfolder
named after its durable tier, which its relaunches find again. `tier_roots` checks a `TieredStore`'s folders first.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path

from ember._atomic_file import replace_file
from ember.checkpoint._store import CheckpointStore

#: The file in a fast tier's folder that names the durable tier it belongs to.
OWNER = "tier-of.json"


def owned_fast_root(fast_root: Path, durable_root: Path) -> Path:
    """The folder of the fast tier whose durable tier is ``durable_root``: ``fast_root`` unless another run owns it.

    A folder that names no owner yet (new, or written before owners were named) becomes this run's. Another run's
    folder gives this run a subfolder named after its durable tier; one that names yet another owner is refused.

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
    owner = _owner(fast_root, durable_root)
    if owner == str(durable_root):
        return fast_root
    own = fast_root / f"of-{durable_root.name}-{hashlib.sha256(str(durable_root).encode()).hexdigest()[:8]}"
    warnings.warn(
        f"The fast folder {fast_root} holds the fast checkpoints of another run (durable tier {owner}); they are "
        f"not read. This run's fast checkpoints go into {own}.",
        RuntimeWarning,
        stacklevel=3,
    )
    mine = _owner(own, durable_root)
    if mine != str(durable_root):
        raise ValueError(f"`fast` cannot hold this run's checkpoints: {own} belongs to another run too ({mine}).")
    return own


def _owner(fast_root: Path, durable_root: Path) -> str:
    """Whose fast folder ``fast_root`` is (a durable tier's path); one that names no owner yet becomes this run's."""
    marker = fast_root / OWNER
    try:
        return str(json.loads(marker.read_text())["durable"])
    except FileNotFoundError:
        fast_root.mkdir(parents=True, exist_ok=True)
        replace_file(fast_root, OWNER, json.dumps({"durable": str(durable_root)}))
        return str(durable_root)
    except (OSError, ValueError, KeyError, TypeError) as e:  # altered, truncated: whose it is cannot be known
        return f"unknown ({OWNER} cannot be read: {e})"


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
    if isinstance(durable, str | os.PathLike) and os.path.exists(durable) and not os.path.isdir(durable):
        raise ValueError(f"`durable` must be a folder, got {os.fspath(durable)!r}, which is a file.")
    if not isinstance(durable, CheckpointStore | str | os.PathLike):
        raise TypeError(
            f"`durable` must be a folder, a CheckpointStore or an OrbaxStore, got {type(durable).__name__}."
        )
    durable_root = durable.root if isinstance(durable, CheckpointStore) else Path(os.path.abspath(durable))
    return fast_folder("`fast`", fast, {"`durable`": durable_root}), durable_root
