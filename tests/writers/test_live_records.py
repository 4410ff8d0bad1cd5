"""What a run logged reaches its files while it trains: the writer thread's flush timer, and a torn line dropped."""

import json
import re
import time

import pytest

from ember.writers import AsyncWriter, CsvWriter, JsonlWriter

WAIT = 30.0  # the bound on every wait for a file: generous for a loaded machine, never a fixed sleep


def steps_in(path):
    """The steps of the records in ``path`` now (whole lines only)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line)["step"] for line in text.splitlines(keepends=True) if line.endswith("\n")]


def wait_for(condition, what):
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {WAIT} s"
        time.sleep(0.01)


def test_a_record_reaches_the_file_within_flush_secs_though_nothing_follows_it(tmp_path):
    """No flush, no close, no further record: the writer thread flushes on its own once flush_secs have passed."""
    path = tmp_path / "metrics.jsonl"
    writer = AsyncWriter(JsonlWriter(path), flush_secs=0.2)
    writer.write_scalars(1, {"loss": 0.5})
    writer.write_scalars(2, {"loss": 0.25})
    wait_for(lambda: steps_in(path) == [1, 2], "the flush of steps 1 and 2")
    writer.write_scalars(3, {"loss": 0.125})  # the timer starts again with the next record
    wait_for(lambda: steps_in(path) == [1, 2, 3], "the flush of step 3")
    writer.close()
    assert steps_in(path) == [1, 2, 3]


def test_records_that_keep_coming_are_flushed_on_time_anyway(tmp_path, monkeypatch):
    """A record every few ms never leaves the queue idle: the thread still flushes flush_secs after the oldest one."""
    path = tmp_path / "metrics.jsonl"
    flushed = []
    inner = JsonlWriter(path)
    flush = inner.flush
    monkeypatch.setattr(inner, "flush", lambda: flushed.append(len(steps_in(path))) or flush())
    writer = AsyncWriter(inner, flush_secs=0.1)
    step = 0
    while not flushed:  # bounded: the first flush is due 0.1 s after the first record
        step += 1
        writer.write_scalars(step, {"loss": 1.0 / step})
        time.sleep(0.002)
        assert step < 15_000, "no flush while records kept coming"
    writer.close()
    assert steps_in(path) == list(range(1, step + 1))


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "5"])
def test_flush_secs_must_be_a_positive_number_of_seconds(bad):
    with pytest.raises(ValueError, match=re.escape(f"`flush_secs` must be a positive number of seconds, got {bad!r}.")):
        AsyncWriter(JsonlWriter("unused.jsonl"), flush_secs=bad)


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_resume_at_drops_a_last_line_a_kill_cut_off(tmp_path, kind):
    """The torn line goes whole; the next record starts a line of its own, and every line parses."""
    path = tmp_path / f"metrics.{kind}"
    writer = JsonlWriter(path) if kind == "jsonl" else CsvWriter(path)
    for step in (1, 2, 3):
        writer.write_scalars(step, {"loss": 0.5})
    writer.close()
    whole = path.read_text()
    torn = '{"step": 4, "time": 1.0, "lo' if kind == "jsonl" else "4,lo"
    path.write_text(whole + torn)
    writer.resume_at(3)
    assert path.read_text() == whole
    writer.write_scalars(4, {"loss": 0.25})
    writer.close()
    lines = path.read_text().splitlines()
    if kind == "jsonl":
        assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]
    else:
        assert lines == ["step,name,value", "1,loss,0.5", "2,loss,0.5", "3,loss,0.5", "4,loss,0.25"]


@pytest.mark.parametrize("make", ["jsonl", "csv", "tensorboard", "run writer"])
def test_a_log_that_cannot_be_written_fails_where_it_is_set_up_naming_it(tmp_path, make):
    from ember.writers import TensorBoardWriter, create_run_writer

    blocker = tmp_path / "taken"
    blocker.write_text("a file where the log folder should be")
    makers = {
        "jsonl": lambda: JsonlWriter(blocker / "metrics.jsonl"),
        "csv": lambda: CsvWriter(blocker / "metrics.csv"),
        "tensorboard": lambda: TensorBoardWriter(blocker / "tb"),
        "run writer": lambda: create_run_writer(blocker / "run", ["jsonl"]),
    }
    name, argument, folder = {
        "jsonl": ("JsonlWriter", "path", blocker),
        "csv": ("CsvWriter", "path", blocker),
        "tensorboard": ("TensorBoardWriter", "logdir", blocker / "tb"),
        "run writer": ("create_run_writer", "run_dir", blocker / "run"),
    }[make]
    with pytest.raises(OSError, match=re.escape(f"{name} cannot write in `{argument}` {folder}: [Errno ")):
        makers[make]()
    with pytest.raises(IsADirectoryError, match=re.escape(f"JsonlWriter: `path` {tmp_path} is a folder; give the")):
        JsonlWriter(tmp_path)


def test_wandb_flush_secs_must_be_a_positive_number_of_seconds(tmp_path):
    from ember.writers import WandbWriter

    with pytest.raises(ValueError, match=re.escape("`flush_secs` must be a positive number of seconds, got 0.")):
        WandbWriter(dir=tmp_path, flush_secs=0)
