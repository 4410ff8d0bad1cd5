"""Draws the docs' figures as SVG: ``python docs/figures.py`` rewrites ``docs/figures/*.svg``.

The event order is recorded from the engine itself (three runs: a plain one, one with ``terminate()``, one
resumed from a mid-epoch state), so the picture cannot drift from the code; a test compares the checked-in
files with what this script draws.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from pathlib import Path

from ember import Engine, Events

FIGURES = Path(__file__).resolve().parent / "figures"
KIND = {  # event -> fill colour, by what it brackets
    "STARTED": "#f4d35e",
    "COMPLETED": "#f4d35e",
    "EPOCH_STARTED": "#9cc5a1",
    "EPOCH_COMPLETED": "#9cc5a1",
    "TERMINATE": "#ee6c4d",
    "TERMINATE_SINGLE_EPOCH": "#ee6c4d",
    "INTERRUPT": "#ee6c4d",
}
ITERATION = "#bcd4e6"


def recorded(prepare: Callable[[Engine], None], **run: object) -> list[str]:
    """The events one run fires, in order: two epochs over two batches unless ``run`` says otherwise."""
    engine, fired = Engine(lambda e, b: b), []
    for event in Events:
        engine.add_event_handler(event, lambda e, event=event: fired.append(event.name))
    prepare(engine)
    engine.run([1, 2], **{"max_epochs": 2, **run})
    return fired


def _terminate_at_3(engine: Engine) -> None:
    engine.add_event_handler(
        Events.ITERATION_COMPLETED(once=3), lambda e: e.terminate()
    )


def _resume_at_1(engine: Engine) -> None:
    engine.load_state_dict({"epoch_length": 2, "iteration": 1, "max_epochs": 2})


def lanes() -> list[tuple[str, list[str]]]:
    """The three runs the event-order figure shows, titled."""
    return [
        ("run(data, max_epochs=2)", recorded(lambda e: None)),
        ("terminate() at iteration 3", recorded(_terminate_at_3)),
        ("resumed from iteration 1", recorded(_resume_at_1)),
    ]


def _box(
    x: float, y: float, w: float, h: float, fill: str, text: str, size: int = 11
) -> str:
    return (
        f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="4" fill="{fill}" stroke="#555" stroke-width="0.6"/>'
        f'<text x="{x + w / 2}" y="{y + h / 2 + size / 3}" font-size="{size}" text-anchor="middle">'
        f"{escape(text)}</text>"
    )


def _svg(width: float, height: float, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif">\n'
        f'<rect width="{width}" height="{height}" fill="white"/>\n'
        + "\n".join(body)
        + "\n</svg>\n"
    )


def event_order() -> str:
    """One column per run, its events top to bottom, coloured by what they bracket."""
    col, row, box_w, box_h, top = 250, 19, 220, 16, 40
    runs = lanes()
    body = []
    for i, (title, events) in enumerate(runs):
        x = 15 + i * col
        body.append(
            f'<text x="{x + box_w / 2}" y="24" font-size="13" font-weight="bold" text-anchor="middle">'
        )
        body[-1] += f"{escape(title)}</text>"
        for j, name in enumerate(events):
            indent = 0 if name in KIND else 14
            fill = KIND.get(
                name, ITERATION if name.startswith("ITERATION") else "#e8e8e8"
            )
            body.append(
                _box(x + indent, top + j * row, box_w - indent, box_h, fill, name, 10)
            )
    height = top + max(len(events) for _, events in runs) * row + 10
    return _svg(15 + len(runs) * col, height, body)


def _arrow(x1: float, y1: float, x2: float, y2: float, label: str = "") -> str:
    line = f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#333" stroke-width="1.4" marker-end="url(#head)"/>'
    if label:  # beside a vertical arrow, above a horizontal one
        x, y, anchor = (
            (x1 + 6, (y1 + y2) / 2 + 4, "start")
            if x1 == x2
            else ((x1 + x2) / 2, y1 - 6, "middle")
        )
        line += f'<text x="{x}" y="{y}" font-size="10" text-anchor="{anchor}">{escape(label)}</text>'

    return line


def data_flow() -> str:
    """Where a batch goes and what crosses back to the host, and when."""
    head = (
        '<defs><marker id="head" markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto">'
        '<path d="M0,0 L8,4 L0,8 z" fill="#333"/></marker></defs>'
    )
    host, device = "#e8e8e8", "#bcd4e6"
    body = [
        head,
        '<text x="20" y="22" font-size="12" font-weight="bold">host (Python)</text>',
        '<text x="20" y="172" font-size="12" font-weight="bold">device (compiled, asynchronous)</text>',
        '<line x1="10" y1="150" x2="860" y2="150" stroke="#999" stroke-dasharray="4,4"/>',
        _box(20, 40, 180, 40, host, "data: an iterator with a position"),
        _box(20, 190, 180, 40, device, "batch, placed ahead (prefetch)"),
        _box(250, 190, 230, 40, device, "step: loss, grads, optax, metrics"),
        _box(250, 260, 230, 34, device, "train state (donated, sharded)"),
        _box(540, 190, 150, 40, device, "output (device arrays)"),
        _box(250, 40, 230, 40, host, "engine: events and filters"),
        _box(540, 40, 150, 40, host, "a handler whose filter fired"),
        _box(730, 20, 120, 34, host, "writer thread"),
        _box(730, 70, 120, 34, host, "checkpoint thread"),
        _arrow(110, 80, 110, 190, "next(data)"),
        _arrow(200, 210, 250, 210),
        _arrow(365, 230, 365, 260),
        _arrow(480, 210, 540, 210),
        _arrow(365, 190, 365, 80, "ITERATION_COMPLETED"),
        _arrow(480, 60, 540, 60),
        _arrow(615, 80, 615, 190, "reads, only here"),
        _arrow(690, 50, 730, 37),
        _arrow(690, 70, 730, 87),
    ]
    return _svg(870, 310, body)


DRAWINGS = {"event_order.svg": event_order, "data_flow.svg": data_flow}


if __name__ == "__main__":
    FIGURES.mkdir(exist_ok=True)
    for name, draw in DRAWINGS.items():
        (FIGURES / name).write_text(draw())
        print(FIGURES / name)
