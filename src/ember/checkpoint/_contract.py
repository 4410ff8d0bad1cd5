"""The format contract: what a checkpoint format writes and reads, and nothing else.

A [`CheckpointStore`][ember.checkpoint.CheckpointStore] holds one format. The store owns everything formats share:
names and their checks, the manifest, the atomic commit of the folder, verification on listing, retention, the
background writer thread, amending, and the processes' agreement on how a save went. A format owns its data files:

- ``prepare`` (the caller's thread): take what the save writes out of training's reach (a host copy, this process's
  shards, or an orbax save started on orbax's threads), and fill in the draft's ``leaves`` or ``tmp``;
- ``write`` (the writer thread): put the data files into the draft's temporary folder (making it if it is the
  format's to make) and return their records, ``{relative path: {"bytes", "crc32"}}``: the store writes them into
  the manifest and commits;
- ``abandon``: after a failed save, let go of what ``prepare`` started (the store removes the folder);
- ``check_kind`` and ``read``: recognise its own checkpoints, and read one back, verified, into a target.

``writers`` says which processes write a save: ``"primary"`` (process 0 writes the whole tree; the others hear how
it went), ``"every"`` (every process writes its share into one folder; process 0 commits) or ``"own"`` (every
process writes its own folder, with no collective).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from ember.checkpoint._manifest import CheckpointInfo

Writers = Literal["primary", "every", "own"]


@dataclass
class Draft:
    """One save, checked and begun in the caller's thread; the writer thread finishes it.

    ``leaves`` is what a format that writes from the host writes (its own copy when the save runs in the
    background); ``tmp`` the temporary folder, once made (orbax's save makes it when it starts).
    """

    name: str
    manifest: dict[str, Any]
    replaces: str | None
    leaves: dict[str, Any] = field(default_factory=dict[str, Any])
    tmp: Path | None = None


class Format(Protocol):
    """How a store's checkpoints hold their arrays (see the module's docstring)."""

    #: which processes write a save: "primary", "every" or "own"
    writers: Writers
    #: whether a checkpoint reads back into the target's shardings (a tiered store reads its fast copy back so)
    sharded: bool

    def prepare(self, draft: Draft, tree: Any, root: Path, *, background: bool) -> None:
        """Take what the save writes out of training's reach (see the module's docstring)."""
        ...

    def write(self, draft: Draft, root: Path) -> dict[str, Any]:
        """Write the data files into ``draft.tmp``; return this process's file records."""
        ...

    def abandon(self, draft: Draft) -> None:
        """After a failed save: let go of what ``prepare`` started."""
        ...

    def check_kind(self, path: Path, manifest: dict[str, Any]) -> None:
        """Raise ``ValueError`` (``WrongStoreError``) if another kind of store wrote the checkpoint in ``path``."""
        ...

    def read(self, info: CheckpointInfo, target: Any, on_verified: Callable[[], object] | None) -> Any:
        """The checkpoint's tree, verified; ``on_verified`` runs after every check, before any array is made."""
        ...

    def close(self) -> None:
        """Stop what the format runs besides the store (orbax's threads)."""
        ...
