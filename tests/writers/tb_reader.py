"""Reads TensorBoard event files back (TFRecord framing + tensorboardX's Event proto), for the tests."""

from __future__ import annotations

import struct
from pathlib import Path

from tensorboardX.proto.event_pb2 import Event


def read_events(logdir: str | Path) -> list[Event]:
    """Every event of every event file under ``logdir``, in file order."""
    events = []
    for path in sorted(Path(logdir).rglob("events.out.tfevents*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            pos += 12  # length and its masked crc
            events.append(Event.FromString(data[pos : pos + length]))
            pos += length + 4  # payload and its masked crc
    return events


def read_scalars(logdir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of every scalar summary under ``logdir``."""
    out: dict[str, list[tuple[int, float]]] = {}
    for event in read_events(logdir):
        for value in event.summary.value:
            if value.HasField("simple_value"):
                out.setdefault(value.tag, []).append((event.step, round(value.simple_value, 6)))
    return out


def tags(logdir: str | Path) -> set[str]:
    """Every summary tag under ``logdir``."""
    return {v.tag for e in read_events(logdir) for v in e.summary.value}


def tensorboard_scalars(logdir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` as TensorBoard itself shows them: its own reader, purge marks honoured."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(logdir), size_guidance={"scalars": 0})  # 0: keep every point
    accumulator.Reload()
    return {
        tag: [(e.step, round(e.value, 6)) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]
    }
