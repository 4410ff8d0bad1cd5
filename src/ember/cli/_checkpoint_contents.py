"""What a checkpoint holds: shown without building a model (`ember inspect`), its weights written out (`export`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ember.checkpoint import CheckpointInfo, open_store


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def describe_checkpoint(path: str | os.PathLike[str]) -> str:
    """A readable report of a checkpoint (a folder of one; of many: the latest; a run folder: each store's latest).

    A run folder of ``ember train`` (or its ``checkpoints/``) holds several stores (``latest``, ``best``):
    each gets a section headed by its folder.

    It shows the step, metrics, size, the tree's paths with shapes and dtypes, and the state dicts saved
    beside it. Every file of the checkpoint is read and checked against the size and CRC-32 its manifest records, as a
    restore would; a damaged one raises ``CorruptCheckpointError`` naming the file.

    Examples:
        >>> import tempfile, numpy as np
        >>> from ember.checkpoint import CheckpointStore
        >>> from ember.cli import describe_checkpoint
        >>> store = CheckpointStore(tempfile.mkdtemp())
        >>> info = store.save({"w": np.zeros((2, 3), np.float32)}, step=7, metrics={"loss": 0.5})
        >>> print(describe_checkpoint(info.path))  # doctest: +ELLIPSIS
        checkpoint step_00000007
          step     7
          metrics  loss=0.5
          size     ... (1 arrays, 6 values)
          verified 1 file: sizes and CRC-32 match
          tree
            w  float32[2, 3]
    """
    target = Path(path)
    if not target.exists():
        raise FileNotFoundError(f"No checkpoint at {target}.")
    if (target / "manifest.json").exists():
        return _report(open_store(target.parent).verify(target, full=True))
    stores = _stores_in(target)
    if stores:
        return "\n\n".join(f"{store}:\n{describe_checkpoint(store)}" for store in stores)
    store = open_store(target)
    info = store.latest()
    if info is None:
        raise FileNotFoundError(f"No valid checkpoint in {target}.")
    return _report(store.verify(info.path, full=True))


def _holds_checkpoints(folder: Path) -> bool:
    return any(c.is_dir() and (c / "manifest.json").exists() for c in folder.iterdir())


def _stores_in(target: Path) -> list[Path]:
    """The checkpoint folders inside a run folder (``checkpoints/latest``, ``checkpoints/best``), if it is one."""
    if _holds_checkpoints(target):
        return []  # a store itself: its latest checkpoint
    root = target / "checkpoints" if (target / "checkpoints").is_dir() else target
    if _holds_checkpoints(root):
        return [root]
    return [d for d in sorted(root.iterdir()) if d.is_dir() and _holds_checkpoints(d)]


def _report(info: CheckpointInfo) -> str:
    manifest = info.manifest
    tree: dict[str, Any] = manifest.get("tree", {})
    arrays = {p: d for p, d in tree.items() if "shape" in d}
    values = sum(int(_prod(d["shape"])) for d in arrays.values())
    files = info.files
    size = sum(f["bytes"] for f in files.values())
    lines = [
        f"checkpoint {info.path.name}",
        f"  step     {info.step}",
        f"  metrics  {', '.join(f'{k}={v:g}' for k, v in info.metrics.items()) or '-'}",
        f"  size     {_size(size)} ({len(arrays)} arrays, {values} values)",
        f"  verified {len(files)} file{'s' if len(files) != 1 else ''}: sizes and CRC-32 match"
        if files
        else "  verified no file records (written before ember recorded them)",
        "  tree",
    ]
    width = max((len(p) for p in tree), default=0)
    for p, d in tree.items():
        lines.append(
            f"    {p.ljust(width)}  {d['dtype']}{d['shape']}" if "shape" in d else f"    {p.ljust(width)}  {d['value']}"
        )
    states = manifest.get("metadata", {}).get("state_dicts", {})
    if states:
        lines.append("  state dicts")
        rows = list(_flat_values(states))
        width = max(len(key) for key, _ in rows)
        lines += [f"    {key.ljust(width)}  {value}" for key, value in rows]
    return "\n".join(lines)


def _flat_values(state: Any, prefix: str = "") -> Any:
    """``(dotted.key, text)`` for every value of nested state dicts, arrays and numbers written as numbers."""
    if isinstance(state, dict) and not _is_array(state) and set(state) != {"tuple"} and state:
        for key, value in state.items():
            yield from _flat_values(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, _shown(state)


def _is_array(value: Any) -> bool:
    return isinstance(value, dict) and {"dtype", "shape", "data"} <= set(value)


def _shown(value: Any) -> str:
    """A saved value as a reader wants it: ``2.10272`` for a 0-d array, ``(2.1, 1)`` for a tuple of them.

    A list of more than 8 shows its ends and its length (a run's `SavedSteps` lists every step it saved).

    Examples:
        >>> from ember.cli._checkpoint_contents import _shown
        >>> _shown([5, 10]), _shown(list(range(5, 105, 5)))
        ('[5, 10]', '[5, 10, 15, ..., 90, 95, 100] (20 values)')
    """
    if _is_array(value):
        data = value["data"]
        if not value["shape"] and isinstance(data, list) and len(data) == 1:
            return _shown(data[0])
        shape = ", ".join(str(n) for n in value["shape"])
        return f"{value['dtype']}[{shape}]" + (f" {[_shown(v) for v in data]}" if len(data) <= 8 else "")
    if isinstance(value, dict) and set(value) == {"tuple"}:
        return "(" + ", ".join(_shown(v) for v in value["tuple"]) + ")"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list) and len(value) > 8:
        ends = [*map(_shown, value[:3]), "...", *map(_shown, value[-3:])]
        return "[" + ", ".join(ends) + f"] ({len(value)} values)"
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return str(value)


def _prod(shape: list[int]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


#: The formats by name, and the suffix that picks each (Orbax's is a folder: ``--format orbax`` picks it).
FORMATS = {"msgpack": ".msgpack", "safetensors": ".safetensors", "orbax": None}

#: What ``--take`` may choose: the train state's parts each takes.
TAKES = {"params": ("params",), "model": ("params", "model_state")}


def export_weights(
    run_dir: str | os.PathLike[str],
    output: str | os.PathLike[str],
    checkpoint: str = "latest",
    take: str = "params",
    overrides: Sequence[str] = (),
    format: str | None = None,
    ema: bool = False,
) -> str:
    """Write the weights of a run's checkpoint to ``output``; return the line ``ember export`` prints.

    The run's ``config.yaml`` builds its model, and the checkpoint (``latest``, ``best`` or a step, as ``ember eval``
    names them) is restored into it and checked as a resume checks it. ``take="params"`` writes the parameters;
    ``"model"`` adds the model's state (batch statistics, an NNX module's RNG streams), all a forward pass needs.
    The format is ``format``, else the suffix of ``output``: ``.msgpack`` (``flax.serialization.msgpack_restore``
    reads it back as nested dicts, ``{"params": {...}}``, what a linen module's ``apply`` takes), ``.safetensors``
    (flat keys named as ``ember inspect`` names them, ``params.Dense_0.kernel``; the optional ``safetensors``
    package, in the ``export`` extra), or ``format="orbax"``: an Orbax checkpoint folder of the same nested dicts
    (``orbax.checkpoint.StandardCheckpointer().restore(output)`` reads it). ``ema`` writes the moving average of the
    parameters a run with ``optimizer.ema`` keeps, in their place. A file is written whole or not at all (a
    temporary file, fsynced, renamed over ``output``); an Orbax folder is committed by Orbax, and never over one that
    exists.

    Examples:
        >>> import tempfile
        >>> from ember.cli._checkpoint_contents import export_weights
        >>> export_weights(tempfile.mkdtemp(), "weights.txt")
        Traceback (most recent call last):
        ValueError: OUTPUT must end in .msgpack or .safetensors, or --format orbax name a folder; got 'weights.txt'.
    """
    target = Path(output)
    if format is not None and format not in FORMATS:
        raise ValueError(f"`--format` must be one of {sorted(FORMATS)}, got {format!r}.")
    kind = format or next((k for k, suffix in FORMATS.items() if suffix == target.suffix), None)
    if kind is None:
        raise ValueError(
            f"OUTPUT must end in .msgpack or .safetensors, or --format orbax name a folder; got {str(output)!r}."
        )
    if take not in TAKES:
        raise ValueError(f"`--take` must be one of {sorted(TAKES)}, got {take!r}.")
    from ember._extras import require

    if kind == "safetensors":
        require("safetensors.numpy", feature="ember export to .safetensors", package="safetensors", extra="export")
    if kind == "orbax":
        require("orbax.checkpoint", feature="ember export --format orbax", package="orbax-checkpoint", extra="orbax")
        if os.path.lexists(target):
            raise ValueError(f"OUTPUT {target} exists; an Orbax export writes a new folder: name another.")
    elif target.is_dir():
        raise ValueError(f"OUTPUT {target} is a folder; name the file to write.")
    if not target.parent.is_dir():
        raise FileNotFoundError(f"OUTPUT's folder {target.parent} does not exist.")
    flat, info = _restored(run_dir, checkpoint, take, overrides, ema)
    _write(flat, kind, target)
    values = sum(int(np.size(v)) for v in flat.values())
    return f"{info.path.name} (iteration {info.step}): {len(flat)} arrays, {values:,} values -> {target}"


def _restored(
    run_dir: str | os.PathLike[str], checkpoint: str, take: str, overrides: Sequence[str], ema: bool
) -> tuple[dict[str, np.ndarray], Any]:
    """The parts ``take`` names of the checkpoint's train state as ``{name: host array}``, and the checkpoint.

    With ``ema``, the moving average of the parameters stands as its parameters.
    """
    import jax

    from ember._flat_tree import flatten_tree
    from ember.cli._evaluations.job import EvaluationJob, checkpoint_of

    job = EvaluationJob(Path(run_dir), overrides)
    info = checkpoint_of(job.run, checkpoint)
    if ema and job.cfg.optimizer.ema is None:
        raise ValueError(f"`--ema`: {run_dir} keeps no moving average of its parameters (its optimizer.ema is null).")
    job.restore(info)
    state = job.trainer.state.train_state
    if ema:
        from ember.training import ema_params

        state = state.replace(params=ema_params(state))
    flat = flatten_tree({part: _pure(getattr(state, part)) for part in TAKES[take]})
    return {name: np.asarray(jax.device_get(leaf)) for name, leaf in flat.items()}, info


def _pure(tree: Any) -> Any:
    """An NNX ``State`` as plain nested dicts of arrays (no ``.value`` in the names), anything else as it is."""
    from flax import nnx

    return nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree


def _write(flat: dict[str, np.ndarray], kind: str, target: Path) -> None:
    """``flat`` written to ``target`` as ``kind`` says (msgpack and Orbax: nested dicts by the names' dotted parts)."""
    from flax import serialization, traverse_util

    from ember._atomic_file import replace_file

    if kind == "safetensors":
        from safetensors.numpy import save

        replace_file(target.parent, target.name, save({name: np.ascontiguousarray(a) for name, a in flat.items()}))
        return
    nested = traverse_util.unflatten_dict({tuple(name.split(".")): leaf for name, leaf in flat.items()})
    if kind == "msgpack":
        replace_file(target.parent, target.name, serialization.msgpack_serialize(nested))
        return
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(target.resolve(), nested)
        checkpointer.wait_until_finished()
