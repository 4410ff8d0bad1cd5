"""Reads W&B's run files (``run-ID.wandb``, LevelDB-log framing of ``wandb.proto`` records) back, for the tests.

W&B's own reader moved into its Go core; the framing is small: a 7-byte header, then 32 KiB blocks of records, each
``crc32 (4) | length (2) | type (1) | payload`` with a payload cut across blocks as FIRST / MIDDLE... / LAST.
"""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path
from typing import Any

_BLOCK, _HEADER, _FULL, _FIRST, _LAST = 32768, 7, 1, 2, 4


def read_records(path: str | Path) -> list[Any]:
    """Every ``wandb_internal_pb2.Record`` in one ``.wandb`` file, in file order (a torn tail is ignored)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    records, payload, pos = [], b"", _HEADER
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # the block's tail is padding
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        if kind == 0 or pos + _HEADER + length > len(data):
            break
        payload += data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            records.append(record)
            payload = b""
        elif kind != _FIRST and not payload:
            raise AssertionError(f"{path}: a record's middle without its start at byte {pos}")
    return records


def records_with(path: str | Path, field: str, timeout: float = 60) -> list[Any]:
    """The records of ``path`` once one of them holds ``field`` (``"run"``, ``"exit"``), polled for ``timeout`` seconds.

    W&B's service writes the file on a process of its own: on a busy machine the records can reach it after the run's
    ``finish()`` returned (once in a full suite run, the run file held its header only). After the bound, the records
    as they are: the caller's assertion names what is missing.
    """
    deadline = time.monotonic() + timeout
    while True:
        records = read_records(path)
        if any(r.HasField(field) for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def offline_files(run_dir: str | Path) -> list[Path]:
    """Every offline launch's ``run-*.wandb`` file under ``run_dir``, oldest launch first.

    ``os.walk`` and not ``rglob``: a live run's checkpoint writes come and go while we look, and a folder that
    vanishes between listing and entering is skipped, not an error.
    """
    found = []
    for folder, _, files in os.walk(run_dir):
        if Path(folder).name.startswith("offline-run-"):
            found += [Path(folder) / f for f in files if f.startswith("run-") and f.endswith(".wandb")]
    return sorted(found)


def history(run_dir: str | Path) -> list[tuple[str, int, dict[str, Any]]]:
    """``(run id, step, values)`` of every history row of every offline run under ``run_dir``, launch by launch."""
    rows = []
    for path in offline_files(run_dir):
        run_id = path.stem.removeprefix("run-")
        for record in read_records(path):
            if record.WhichOneof("record_type") == "history":
                items = ((i.key or ".".join(i.nested_key), i.value_json) for i in record.history.item)
                values = {key: json.loads(value) for key, value in items if not key.startswith("_")}
                rows.append((run_id, record.history.step.num, values))
    return rows


def exit_codes(run_dir: str | Path) -> list[int]:
    """The exit code each offline launch under ``run_dir`` finished with (none for a launch that died)."""
    return [
        r.exit.exit_code
        for path in offline_files(run_dir)
        for r in read_records(path)
        if r.WhichOneof("record_type") == "exit"
    ]


def config_and_summary(run_dir: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's config and summary as W&B merges them: every offline launch's updates under ``run_dir``, in order."""
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for path in offline_files(run_dir):
        for record in read_records(path):
            kind = record.WhichOneof("record_type")
            items, into = {
                "run": (record.run.config.update, config),
                "config": (record.config.update, config),
                "summary": (record.summary.update, summary),
            }.get(kind, ((), config))
            for i in items:
                into[i.key or ".".join(i.nested_key)] = json.loads(i.value_json)
    return config, summary
