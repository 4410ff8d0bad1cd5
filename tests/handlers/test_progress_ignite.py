"""ProgressBar as Ignite 0.5.5's documented lines use it.

``file=``, vectors and strings, ``state_attributes``, ``log_message``, ``event_name``, and Ignite's text.

Ignite's frames were recorded with torch 2.13.0 (CPU) and pytorch-ignite 0.5.5 running the same lines on an engine
whose output is ``{"loss": b, "vec": torch.tensor([1.0, 2.0]), "tag": "hi"}`` over ``[0.5, 0.25]`` for 2 epochs,
``ProgressBar(file=out, display="bar", persist=True, mininterval=0)``, ``attach(e, output_transform=lambda o: o,
state_attributes=["alpha"])``; its last frame of epoch 1 was
``Epoch [1/2]: [2/2] 100%|##########, loss=0.25, vec_0=1, vec_1=2, tag=hi, alpha=0.5 [00:00<00:00]``.
"""

import io
import re

import numpy as np
import pytest

from ember import Engine, Events
from ember.handlers import ProgressBar


def frames(out):
    text = out.getvalue().replace("\x1b[A", "").replace("\n", "\r")
    return [f.strip() for f in text.split("\r") if f.strip()]


def _engine():
    engine = Engine(lambda e, b: {"loss": b, "vec": np.array([1.0, 2.0], np.float32), "tag": "hi"})
    engine.state.alpha = 0.5
    return engine


def test_ignites_documented_lines_draw_ignites_bar():
    out = io.StringIO()
    engine = _engine()
    bar = ProgressBar(file=out, display="bar", persist=True, mininterval=0)
    bar.attach(engine, output_transform=lambda o: o, state_attributes=["alpha"], event_name=Events.ITERATION_COMPLETED)
    engine.add_event_handler(Events.ITERATION_COMPLETED(once=2), lambda: bar.log_message("hello"))
    engine.run([0.5, 0.25], max_epochs=2)
    shown = frames(out)
    assert "hello" in shown
    ends = [[f for f in shown if f.startswith(f"Epoch [{e}/2]") and "100%" in f][-1] for e in (1, 2)]
    pattern = r"Epoch \[{}/2\]: \[2/2\] 100%\|#+, loss=0.25, vec_0=1, vec_1=2, tag=hi, alpha=0.5 \[00:0\d<00:00\]"
    assert re.fullmatch(pattern.format(1), ends[0]), ends[0]
    assert re.fullmatch(pattern.format(2), ends[-1]), ends[-1]


def test_a_value_it_cannot_show_warns_once_and_the_rest_are_shown():
    out = io.StringIO()
    engine = Engine(lambda e, b: {"loss": b, "image": np.zeros((2, 2))})
    ProgressBar(1, stream=out, display="bar", persist=True, mininterval=0, bar_format="{desc} {n}{postfix}").attach(
        engine, output_transform=lambda o: o
    )
    with pytest.warns(UserWarning, match=re.escape("ProgressBar cannot show 'image': a value of shape (2, 2)")) as w:
        engine.run([0.5, 0.25, 0.125])
    assert len(w) == 1
    assert frames(out)[-1] == "Iteration:  3, loss=0.125"


def test_file_and_stream_are_one_argument():
    with pytest.raises(ValueError, match=re.escape("ProgressBar got both `stream` and `file`, which are the same")):
        ProgressBar(stream=io.StringIO(), file=io.StringIO())


def test_ignites_bar_over_the_epochs():
    out = io.StringIO()
    engine = Engine(lambda e, b: b)
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: e.state.metrics.update(acc=e.state.epoch / 10))
    ProgressBar(file=out, display="bar", mininterval=0, bar_format="{desc} {n}/{total}{postfix}").attach(
        engine, metric_names=["acc"], event_name=Events.EPOCH_COMPLETED, closing_event_name=Events.COMPLETED
    )
    engine.run([1, 2], max_epochs=3)
    assert frames(out) == ["Epochs 0/3", "Epochs 1/3, acc=0.1", "Epochs 2/3, acc=0.2"] + ["Epochs 3/3, acc=0.3"] * 2


def test_events_it_cannot_move_on_are_named():
    with pytest.raises(ValueError, match=r"ProgressBar moves on ITERATION_STARTED or ITERATION_COMPLETED .* got "):
        ProgressBar().attach(Engine(lambda e, b: b), event_name=Events.EPOCH_STARTED)
    with pytest.raises(TypeError, match=re.escape("`state_attributes` must be a sequence of state attribute names")):
        ProgressBar().attach(Engine(lambda e, b: b), state_attributes="alpha")  # type: ignore[arg-type]


def test_a_bar_attached_again_replaces_the_first_of_its_kind_and_another_kind_stays():
    """A notebook cell run twice: the second iteration bar replaces the first, with one warning.

    Ignite's epoch bar beside them stays, with no warning.
    """
    first_out, second_out, epochs_out = io.StringIO(), io.StringIO(), io.StringIO()
    engine = Engine(lambda e, b: {"loss": b})
    ProgressBar(file=first_out, display="bar", persist=True, mininterval=0).attach(engine, output_keys=["loss"])
    ProgressBar(file=epochs_out, display="bar", persist=True, mininterval=0).attach(
        engine, event_name=Events.EPOCH_COMPLETED, closing_event_name=Events.COMPLETED
    )
    with pytest.warns(UserWarning, match="bar of the same kind is replaced") as said:
        ProgressBar(file=second_out, display="bar", persist=True, mininterval=0).attach(engine, output_keys=["loss"])
    assert len(said) == 1
    engine.run([0.5, 0.25], max_epochs=2)
    assert first_out.getvalue() == ""  # the replaced bar draws nothing
    assert [f for f in frames(second_out) if "100%" in f][-1].startswith("Epoch [2/2]: [2/2] 100%")
    assert frames(epochs_out)[-1].startswith("Epochs[2/2] 100%")
