"""Where the progress goes decides what is drawn: a bar on a terminal, lines in a file, a widget in a notebook."""

import io
import os
import pty
import re

import nbformat
import pytest
from nbclient import NotebookClient

from ember import Engine, Events
from ember.handlers import ProgressBar
from ember.handlers._reporting import display
from tests.handlers.test_reporting import bar_frames


def _engine():
    engine = Engine(lambda e, b: {"loss": b})
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: e.state.metrics.update(acc=e.state.epoch / 4))
    return engine


def test_a_file_gets_one_plain_line_an_epoch():
    """A batch log: no carriage return, no escape code, exactly one line an epoch with the epoch's values."""
    log = io.StringIO()
    engine = _engine()
    ProgressBar(1, stream=log, epoch_bar=True, mininterval=0).attach(engine, metric_names="all", output_keys=["loss"])
    engine.run([0.5, 0.25, 0.125], max_epochs=2)
    text = log.getvalue()
    assert "\r" not in text
    assert "\x1b" not in text
    lines = text.splitlines()
    assert [re.sub(r" 00:0\d,", " T,", line) for line in lines] == [
        "Epoch [1/2]: [3/3] T, acc=0.25, loss=0.125",
        "Epoch [2/2]: [3/3] T, acc=0.5, loss=0.125",
    ]


def test_the_epoch_bar_of_a_run_bounded_by_max_iters_counts_its_partial_last_epoch():
    """max_iters=5 over epochs of 2: three epochs (2, 2 and 1 iterations), so the epoch bar's total is 3, not 2."""
    out = io.StringIO()
    engine = _engine()
    ProgressBar(1, stream=out, display="bar", epoch_bar=True, mininterval=0).attach(engine, output_keys=["loss"])
    state = engine.run([0.5, 0.25], max_iters=5)
    assert (state.epoch, state.iteration) == (3, 5)
    shown = sorted(set(re.findall(r"Epochs\[(\d+)/(\d+)\]", out.getvalue())))
    assert shown == [("0", "3"), ("1", "3"), ("2", "3")]  # the last epoch ends partway: max_iters stops the run


def test_nested_mappings_and_sequences_in_the_values_show_as_their_paths():
    """A metric that is a mapping of a mapping and a sequence: ``parts_a=1, parts_b_c=2, parts_d_0=3, parts_d_1=4``."""
    log = io.StringIO()
    engine = Engine(lambda e, b: {"loss": b})
    engine.add_event_handler(
        Events.ITERATION_COMPLETED, lambda e: e.state.metrics.update(parts={"a": 1, "b": {"c": 2}, "d": [3, 4]})
    )
    ProgressBar(1, stream=log, mininterval=0).attach(engine, metric_names=["parts"])
    engine.run([0.5], max_epochs=1)
    assert log.getvalue().rstrip().endswith(", parts_a=1, parts_b_c=2, parts_d_0=3, parts_d_1=4")


def test_an_evaluators_persisting_bar_is_cleared_when_it_runs_nested_in_a_trainers():
    """persist=True keeps a finished bar on screen, except nested in another's (an evaluation in a training run)."""
    out = io.StringIO()
    trainer, evaluator = _engine(), Engine(lambda e, b: b)
    ProgressBar(1, stream=out, display="bar", epoch_bar=True, mininterval=0).attach(trainer)  # open all run long
    shown = ProgressBar(1, stream=out, display="bar", persist=True, mininterval=0)
    shown.attach(evaluator)
    kept = []
    evaluator.add_event_handler(Events.ITERATION_COMPLETED, lambda e: kept.append(shown._bar.leave))
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: evaluator.run([1, 2]))
    trainer.run([0.5], max_epochs=2)
    evaluator.run([1, 2])  # on its own: its bar stays
    assert kept == [False, False, False, False, True, True]


def test_a_terminal_gets_the_bar():
    """The same bar on a pseudo-terminal draws frames redrawn in place (carriage returns)."""
    leader, follower = pty.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as terminal:
            assert display.shown_as("auto", terminal) == "bar"
            engine = _engine()
            ProgressBar(1, stream=terminal, mininterval=0, ncols=60).attach(engine, output_keys=["loss"])
            engine.run([0.5, 0.25], max_epochs=1)
            terminal.flush()
        drawn = os.read(leader, 65536).decode()
    finally:
        os.close(leader)
        os.close(follower)
    assert "\r" in drawn
    assert "Iteration: [2/2] 100%" in drawn


def test_the_rest_of_an_epoch_resumed_midway_has_a_bar():
    """A run continued inside an epoch (no EPOCH_STARTED for it) draws that epoch's bar from where it stands."""
    out = io.StringIO()
    engine = Engine(lambda e, b: {"loss": b})
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=6), lambda e: e.terminate(final=False))
    bar = ProgressBar(1, stream=out, display="bar", epoch_bar=True, mininterval=0, bar_format="{desc} {n}/{total}")
    bar.attach(engine)
    engine.run([1, 2, 3, 4], max_epochs=3)
    out.truncate(0), out.seek(0)
    engine.run([1, 2, 3, 4], max_epochs=3)
    assert bar_frames(out) == [
        "Epochs 1/3",  # one epoch done, the second in progress
        "Epoch [2/3]:  2/4",  # the rest of epoch 2, from iteration 6
        "Epoch [2/3]:  3/4",
        "Epoch [2/3]:  4/4",
        "Epochs 2/3",
        "Epoch [3/3]:  0/4",
        "Epoch [3/3]:  1/4",
        "Epoch [3/3]:  2/4",
        "Epoch [3/3]:  3/4",
        "Epoch [3/3]:  4/4",
        "Epochs 3/3",
        "Epochs 3/3",
    ]


def test_a_notebook_without_ipywidgets_gets_lines_on_standard_output_and_one_note(monkeypatch, capsys):
    monkeypatch.setattr(display, "in_a_notebook", lambda: True)
    monkeypatch.setattr(display, "widgets_available", lambda: False)
    monkeypatch.setattr("ember.handlers._reporting.progress.in_a_notebook", lambda: True)
    engine = _engine()
    with pytest.warns(UserWarning, match=re.escape("ProgressBar: this notebook has no ipywidgets")) as said:
        ProgressBar().attach(engine, output_keys=["loss"])
    assert len(said) == 1
    engine.run([0.5], max_epochs=1)
    out, err = capsys.readouterr()
    assert re.fullmatch(r"Iteration: \[1/1\] 00:0\d, loss=0.5\n", out)
    assert err == ""


def test_a_display_it_does_not_know_or_cannot_draw_is_named():
    with pytest.raises(ValueError, match=re.escape("`display` must be one of 'auto', 'bar', 'widget', 'lines'; got")):
        ProgressBar(display="tqdm")
    engine = Engine(lambda e, b: b)
    with pytest.raises(ValueError, match=re.escape("display='widget' draws tqdm's notebook widget: it needs")):
        ProgressBar(display="widget").attach(engine)
    ProgressBar(display="lines").attach(engine)  # the refused bar holds nothing: no "replaced" warning (an error here)


NOTEBOOK = [
    "import warnings; warnings.simplefilter('error')",
    "from ember import Engine\nfrom ember.handlers import ProgressBar\n"
    "engine = Engine(lambda e, b: {'loss': b})\nhandle = ProgressBar(1).attach(engine, output_keys=['loss'])",
    "_ = engine.run([0.5, 0.25, 0.125], max_epochs=2)",
    "log = open('bar.log', 'w')\nother = Engine(lambda e, b: {'loss': b})\n"
    "_ = ProgressBar(1, stream=log).attach(other, output_keys=['loss'])\n_ = other.run([0.5], max_epochs=1)\n"
    "log.close()",
]


def test_a_notebook_gets_the_widget_and_no_text_frames(tmp_path):
    """A notebook run through a real Jupyter kernel (nbclient): the bars are widgets, nothing is drawn as text.

    A bar given a file of its own there writes lines into it, not a widget: the widget is for the notebook's output.
    """
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in NOTEBOOK])
    client = NotebookClient(notebook, timeout=120, kernel_name="python3", startup_timeout=120)
    client.execute(cwd=str(tmp_path))
    outputs = notebook.cells[2].outputs
    widgets = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(widgets) == 2  # one bar an epoch
    assert [o for o in outputs if o.output_type == "stream"] == []  # no text frames, no warnings
    assert [o for o in outputs if o.output_type == "error"] == []
    assert notebook.cells[3].outputs == []  # the bar with a file: no widget, nothing in the notebook
    assert re.fullmatch(r"Iteration: \[1/1\] 00:0\d, loss=0.5\n", (tmp_path / "bar.log").read_text())


def test_a_plain_ipython_shell_is_not_a_notebook():
    """IPython's own terminal shell, really started: not a kernel, so a bar there draws as on a terminal."""
    from IPython.terminal.interactiveshell import TerminalInteractiveShell

    from ember.handlers._reporting.display import in_a_notebook

    TerminalInteractiveShell.instance()
    try:
        assert in_a_notebook() is False
    finally:
        TerminalInteractiveShell.clear_instance()
