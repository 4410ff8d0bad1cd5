"""`init_from`: a train state (or any pytree) started from another run's weights, with a report of what was taken."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jax
import numpy as np

from ember._flat_tree import flatten_tree, unflatten_like

#: What ``take`` chooses of a train state, as the prefixes of its leaves' names.
TAKES = {"params": ("params.",), "params_and_opt_state": ("params.", "opt_state."), "all": ("",)}


@dataclass
class InitReport:
    """What [`init_from`][ember.checkpoint.init_from] did: each leaf of the target loaded or left fresh, and why.

    Attributes:
        source: the file or checkpoint folder read.
        loaded: the target's leaves taken from the source, by name (``params.Dense_0.kernel``).
        fresh: the target's leaves ``take`` covers but left as they were, each with why (``"fresh: params.head"``,
            ``"not in the source"``).
        not_taken: the target's leaves ``take`` leaves out (``take="params"``: the optimizer state, the step).
        unused: the source's leaves of what ``take`` covers that nothing in the target took (after ``rename``).

    Examples:
        >>> from ember.checkpoint import InitReport
        >>> print(InitReport("w.msgpack", ["params.w"], {"params.b": "not in the source"}, ["step"], ["params.old"]))
        from w.msgpack: 1 loaded, 1 left fresh, 1 not taken, 1 unused in the source
          left fresh: params.b (not in the source)
          unused: params.old
    """

    source: str
    loaded: list[str] = field(default_factory=list[str])
    fresh: dict[str, str] = field(default_factory=dict[str, str])
    not_taken: list[str] = field(default_factory=list[str])
    unused: list[str] = field(default_factory=list[str])

    def __str__(self) -> str:
        lines = [
            f"from {self.source}: {len(self.loaded)} loaded, {len(self.fresh)} left fresh, {len(self.not_taken)} not "
            f"taken, {len(self.unused)} unused in the source"
        ]
        lines += [f"  left fresh: {name} ({why})" for name, why in self.fresh.items()]
        lines += [f"  unused: {name}" for name in self.unused]
        return "\n".join(lines)


def init_from(
    target: Any,
    source: str | os.PathLike[str],
    *,
    take: Literal["params", "params_and_opt_state", "all"] = "params",
    rename: Mapping[str, str] | None = None,
    fresh: Sequence[str] = (),
    strict: bool = True,
    checkpoint: str | int = "latest",
    name: str | None = None,
) -> tuple[Any, InitReport]:
    """``target`` with its leaves taken from ``source`` where they match by name: fine-tuning, partial restore.

    ``source`` is a run folder of ``ember train`` (its ``checkpoints/latest``; ``checkpoint="best"`` or a step picks
    another), a folder of checkpoints (its latest valid one, or ``checkpoint``'s step), one checkpoint's folder (an
    ember or an Orbax store's), an Orbax checkpoint of Orbax's own (``ember export --format orbax`` writes one), or a
    file ``ember export`` writes: ``.msgpack`` (``flax.serialization``) or ``.safetensors``. A checkpoint is
    verified against its checksums as a resume verifies it; a file or an Orbax checkpoint of Orbax's own has none (one
    cut short is refused, bytes changed inside an array are not seen). A checkpoint of several objects is read from
    its ``"trainer"``, or from the one ``name`` names.

    Leaves are matched by their names, as ``ember inspect`` shows them (``params.Dense_0.kernel``; an NNX module's
    ``.value`` left out on both sides). ``take`` chooses what of a train state is taken: ``"params"`` (the
    optimizer state and the rest stay fresh, as a new optimizer needs), ``"params_and_opt_state"``, or ``"all"``
    (anything else than a train state: use ``"all"``). ``rename`` maps the source's names first, each rule a regular
    expression and its replacement (``{"^params[.]encoder[.]": "params.backbone."}``). ``fresh`` names subtrees of
    the target left at their initialisation (a new head: ``["params.head"]``). A leaf taken whose shape or dtype
    differs from the target's is refused, naming it and both; one the source lacks is refused too, unless
    ``strict=False`` leaves it fresh (Ignite's ``strict=False``). Each loaded array is placed where the target's leaf
    is (its sharding): a sharded target is restored onto its own devices, never gathered onto one first.

    Returns:
        The new target (the input is not changed) and an [`InitReport`][ember.checkpoint.InitReport].

    Examples:
        >>> import tempfile, pathlib, numpy as np, flax.serialization
        >>> from ember.checkpoint import init_from
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "w.msgpack"
        >>> weights = {"params": {"body": {"w": np.ones(2, np.float32)}, "head": {"w": np.ones(3, np.float32)}}}
        >>> _ = path.write_bytes(flax.serialization.msgpack_serialize(weights))
        >>> new = {"params": {"body": {"w": np.zeros(2, np.float32)}, "head": {"w": np.zeros(5, np.float32)}}}
        >>> tree, report = init_from(new, path, fresh=["params.head"])
        >>> tree["params"]["body"]["w"].tolist(), tree["params"]["head"]["w"].tolist()
        ([1.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0])
        >>> report.loaded, report.fresh, report.unused
        (['params.body.w'], {'params.head.w': 'fresh: params.head'}, ['params.head.w'])
    """
    if take not in TAKES:
        raise ValueError(f"`take` must be one of {sorted(TAKES)}, got {take!r}.")
    if isinstance(fresh, str):
        raise TypeError(f"`fresh` must be a list of names of the target's subtrees, got the string {fresh!r}.")
    rules = [(_pattern(pattern), replacement) for pattern, replacement in (rename or {}).items()]
    flat = flatten_tree(target)
    _check_fresh(fresh, [_plain(n) for n in flat])
    found, where = _read(Path(source), checkpoint, name)
    source_flat = _renamed(found, rules, where)
    report, out, problems = InitReport(where), dict(flat), []
    used: set[str] = set()
    for leaf_name, leaf in flat.items():
        plain = _plain(leaf_name)
        if not any(plain.startswith(prefix) for prefix in TAKES[take]):
            report.not_taken.append(plain)
            continue
        kept = next((f for f in fresh if plain == f or plain.startswith(f"{f}.")), None)
        if kept is not None:
            report.fresh[plain] = f"fresh: {kept}"
            continue
        if plain not in source_flat:
            if strict:
                problems.append(f"{plain}: not in the source")
            else:
                report.fresh[plain] = "not in the source"
            continue
        given = source_flat[plain]
        used.add(plain)
        if _kind(given) != _kind(leaf):
            problems.append(f"{plain}: the source has {_kind(given)}, the target {_kind(leaf)}")
            continue
        out[leaf_name] = _placed(np.asarray(given), leaf)
        report.loaded.append(plain)
    if problems:
        listed = "\n".join(f"  {p}" for p in problems)
        raise ValueError(
            f"{where} does not fit the target ({len(problems)} leaves); leave them fresh with `fresh=[...]` (or "
            f"`strict=False` for leaves the source lacks), or map names with `rename`:\n{listed}"
        )
    report.unused = sorted(n for n in source_flat if n not in used and any(n.startswith(p) for p in TAKES[take]))
    return unflatten_like(target, out), report


def _renamed(found: dict[str, Any], rules: list[tuple[re.Pattern[str], str]], where: str) -> dict[str, Any]:
    """The source's leaves by their names after ``rules``; a rule that matches no name is refused, naming it."""
    out: dict[str, Any] = {}
    matched: set[str] = set()
    for original, leaf in found.items():
        renamed = _plain(original)
        for pattern, replacement in rules:
            if pattern.search(renamed):
                matched.add(pattern.pattern)
                renamed = pattern.sub(replacement, renamed)
        out[renamed] = leaf
    unmatched = [p.pattern for p, _ in rules if p.pattern not in matched]
    if unmatched:
        raise ValueError(f"`rename` rule {unmatched[0]!r} matches no name of {where} ({_some(found)}).")
    return out


def _pattern(pattern: str) -> re.Pattern[str]:
    """A ``rename`` rule's regular expression, compiled; one that is not one is named."""
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(f"`rename` rule {pattern!r} is not a regular expression ({e}).") from None


def _check_fresh(fresh: Sequence[str], names: list[str]) -> None:
    """Each of ``fresh`` must name a leaf or a subtree of the target (``names``, its leaves)."""
    for subtree in fresh:
        if not any(n == subtree or n.startswith(f"{subtree}.") for n in names):
            raise ValueError(f"`fresh` names {subtree!r}, which is no leaf or subtree of the target ({_some(names)}).")


def _some(names: Any) -> str:
    """A few of ``names`` for a message, the parameters' first: ``its names: a, b, c, ... (12 in all)``."""
    listed = sorted((_plain(n) for n in names), key=lambda n: (not n.startswith("params."), n))
    return f"its names: {', '.join(listed[:4])}{', ...' if len(listed) > 4 else ''} ({len(listed)} in all)"


def _plain(name: str) -> str:
    """A leaf's name without NNX's ``.value`` parts: the same on a live NNX state and on plain dicts."""
    return ".".join(part for part in name.split(".") if part != "value")


def _kind(leaf: Any) -> str:
    """``float32[3, 4]``: a leaf's dtype and shape (read from the leaf, never gathered)."""
    dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
    return f"{dtype}[{', '.join(str(n) for n in np.shape(leaf))}]"


def _placed(array: np.ndarray, like: Any) -> Any:
    """``array`` where ``like`` is: onto its sharding (each device its own part), or as NumPy for a NumPy leaf."""
    if isinstance(like, jax.Array):
        return jax.device_put(array, like.sharding)
    return array


def _read(path: Path, checkpoint: str | int, name: str | None) -> tuple[dict[str, Any], str]:
    """The source's leaves by name, and what was read (a file, or a checkpoint's folder)."""
    if path.suffix in (".msgpack", ".safetensors") and path.is_file():
        return _read_weights(path), str(path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"`source` {path} is neither a .msgpack or .safetensors file nor a folder of checkpoints or a run."
        )
    from ember.checkpoint._orbax import open_store

    if not (path / "manifest.json").is_file() and (path / "_CHECKPOINT_METADATA").is_file():
        return _read_weights(path), str(
            path
        )  # one checkpoint written by Orbax itself (``ember export --format orbax``)
    if (path / "manifest.json").is_file():  # one checkpoint
        store = open_store(path.parent)
        info = store.verify(path, full=True)
    else:
        store, info = chosen(path, checkpoint)
    tree, info = store.restore(None, info)
    shown = info.path  # as the caller named it (a store makes its folder absolute)
    if info.path.is_relative_to(path.resolve()):
        shown = path / info.path.relative_to(path.resolve())
    return _object(tree, name, info.path), str(shown)


def _read_weights(path: Path) -> dict[str, Any]:
    """The arrays by name of a ``.msgpack`` or ``.safetensors`` file, or of a folder Orbax wrote, on the host.

    One its library cannot read (truncated, its metadata gone) is named; none of them has checksums to catch an array
    altered inside.
    """
    from flax import traverse_util

    try:
        restored = _loader(path)()
    except Exception as e:  # each library's own error for a file cut short or changed
        what = "Orbax checkpoint" if path.is_dir() else f"{path.suffix} file"
        raise ValueError(f"{path} is not a whole {what} of arrays ({type(e).__name__}: {e}).") from e
    if not isinstance(restored, dict):
        raise ValueError(f"{path} holds a {type(restored).__name__}, not a dict of arrays.")
    return {name: np.asarray(leaf) for name, leaf in traverse_util.flatten_dict(restored, sep=".").items()}


def _loader(path: Path) -> Callable[[], Any]:
    """What reads ``path``'s arrays, its library imported (or the error naming the extra that brings it)."""
    from ember._extras import require

    if path.is_dir():
        ocp = require(
            "orbax.checkpoint", feature="init_from an Orbax checkpoint", package="orbax-checkpoint", extra="orbax"
        )

        def orbax() -> Any:
            with ocp.StandardCheckpointer() as checkpointer:
                return checkpointer.restore(path.resolve())

        return orbax
    if path.suffix == ".safetensors":
        safetensors = require(
            "safetensors.numpy", feature="init_from a .safetensors file", package="safetensors", extra="export"
        )
        return lambda: dict(safetensors.load_file(path))
    from flax import serialization

    return lambda: serialization.msgpack_restore(path.read_bytes())


def chosen(path: Path, checkpoint: str | int) -> tuple[Any, Any]:
    """The store and the checkpoint that ``checkpoint`` names in ``path``: a run folder, or a folder of checkpoints.

    ``"latest"``: the newest valid one (a run's in ``checkpoints/latest``); ``"best"``: the one its ``Checkpoint``
    recorded the highest score for (a run's in ``checkpoints/best``; Ignite's priority, higher is better); a step:
    that step's (a run's from either folder). ``ember eval``, ``ember export`` and ``init_from`` choose by it.

    Examples:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from ember.checkpoint._init_from import chosen
        >>> chosen(Path(tempfile.mkdtemp()) / "run", "latest")
        Traceback (most recent call last):
        FileNotFoundError: .../run holds no valid checkpoint.
    """
    from ember.checkpoint._orbax import open_store

    run = path / "checkpoints"
    kinds = ("latest", "best") if checkpoint not in ("latest", "best") else (str(checkpoint),)
    folders = [run / kind for kind in kinds] if run.is_dir() or (path / "config.yaml").is_file() else [path]
    found = [(store, info) for store in (open_store(f) for f in folders if f.is_dir()) for info in store.checkpoints()]
    if checkpoint in ("latest", "best"):
        if not found:
            raise FileNotFoundError(f"{folders[0]} holds no valid checkpoint.")
        if checkpoint == "latest":
            return found[-1]
        return max(found, key=lambda f: (_recorded(f[1]).get("priority", float("-inf")), f[1].step))
    held = [(store, info) for store, info in found if str(info.step) == str(checkpoint)]
    if not held:
        steps = sorted({info.step for _, info in found})
        raise FileNotFoundError(f"{path} holds no checkpoint of step {checkpoint}; it holds steps {steps}.")
    return held[0]


def _recorded(info: Any) -> dict[str, Any]:
    """What the ``Checkpoint`` that wrote ``info`` recorded of it (its priority), or nothing."""
    return info.manifest.get("metadata", {}).get("checkpoint") or {}


def _object(tree: Any, name: str | None, where: Path) -> dict[str, Any]:
    """The leaves of the checkpoint's object ``name`` (its ``"trainer"``, its only one, or the whole tree), by name."""
    from flax import traverse_util

    objects = sorted(k for k, v in tree.items() if isinstance(v, dict))
    if name is None and "trainer" in objects:
        name = "trainer"
    elif name is None and len(objects) == 1 == len(tree):
        name = objects[0]
    elif name is None and objects and len(objects) == len(tree):
        raise ValueError(f"{where} holds the objects {objects}; name the one to read with `name=`.")
    if name is not None and name not in objects:
        raise ValueError(f"{where} holds no object {name!r}; it holds {objects}.")
    chosen = tree[name] if name is not None else tree
    return traverse_util.flatten_dict(chosen, sep=".")
