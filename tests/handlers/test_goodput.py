"""GoodputLedger: where the wall time went, by category, across a killed run and its relaunch."""

import json
import re

import pytest

from ember import Engine, Events
from ember._ledger_file import CATEGORIES, read_records, totals
from ember.cli import goodput_table, main
from tests.subprocesses import ROOT, run_python


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_each_category_gets_exactly_its_time_and_they_add_up_to_the_wall_time(tmp_path):
    """An injected clock: 3 s of start-up, a 5 s first step, 1 s steps, 0.25 s per batch, 2 s per evaluation."""
    from ember.handlers import GoodputLedger

    clock = Clock()

    class Batches:
        def __len__(self):
            return 4

        def __iter__(self):
            for i in range(4):
                clock.now += 0.25
                yield i

    def step(engine, batch):
        clock.now += 5.0 if engine.state.iteration == 1 else 1.0

    trainer, evaluator = Engine(step), Engine(lambda e, b: None)

    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: evaluator.run([0]))
    evaluator.add_event_handler(Events.ITERATION_COMPLETED, lambda: setattr(clock, "now", clock.now + 2.0))
    ledger = GoodputLedger(tmp_path, clock=clock, started=0.0)
    ledger.attach(trainer, evaluators=[evaluator])
    clock.now = 3.0
    trainer.run(Batches(), max_epochs=2)
    record = read_records(tmp_path)[-1]
    assert {k: record[k] for k in CATEGORIES} == {
        "startup": 3.0,
        "compilation": 5.0,
        "productive": 7.0,
        "data": 2.0,
        "checkpoint": 0.0,
        "evaluation": 4.0,
        "lost": 0.0,
        "other": 0.0,
    }
    assert (record["wall"], record["steps"], record["ended"]) == (21.0, 8, "completed")


def test_a_save_inside_a_step_or_an_evaluation_counts_as_checkpoint_only_and_other_stays_zero(tmp_path):
    """A save blocking 1.5 s at a step's end and 0.5 s at an evaluation's (the best checkpoint's place)."""
    from ember.handlers import Checkpoint, GoodputLedger

    clock = Clock()
    trainer, evaluator = Engine(lambda e, b: setattr(clock, "now", clock.now + 1.0)), Engine(lambda e, b: None)
    saves = Checkpoint({"trainer": trainer}, tmp_path / "checkpoints")

    def blocks(seconds):
        clock.now += seconds
        saves.blocked += seconds

    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=2), lambda: blocks(1.5))  # before the ledger's
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: evaluator.run([0]))
    evaluator.add_event_handler(Events.ITERATION_COMPLETED, lambda: setattr(clock, "now", clock.now + 2.0))
    evaluator.add_event_handler(Events.COMPLETED, lambda: blocks(0.5))
    GoodputLedger(tmp_path, clock=clock, started=0.0).attach(trainer, evaluators=[evaluator], checkpoints=[saves])
    trainer.run([0, 1, 2], max_epochs=1)
    record = read_records(tmp_path)[-1]
    assert {k: record[k] for k in CATEGORIES} == {
        "startup": 0.0,
        "compilation": 1.0,
        "productive": 2.0,
        "data": 0.0,
        "checkpoint": 2.0,
        "evaluation": 2.0,
        "lost": 0.0,
        "other": 0.0,
    }
    assert record["wall"] == 7.0


@pytest.mark.parametrize(
    ("writes", "reached"),
    [
        ("every-iteration", 8),  # the record of iteration 8 was written before the kill
        ("with-checkpoints", 6),  # the default timer (10 s) never fired: the record went with checkpoint 6
    ],
)
def test_a_killed_run_and_its_relaunch_count_the_steps_trained_again_as_lost(tmp_path, writes, reached):
    script = str(ROOT / "tests" / "handlers" / "goodput_script.py")
    killed = run_python([script, str(tmp_path), "kill", writes])
    assert killed.returncode == -9, killed.stderr[-2000:]
    again = run_python([script, str(tmp_path), writes])
    assert again.returncode == 0, again.stderr[-2000:]
    first, second = read_records(tmp_path)
    assert (first["first_iteration"], first["last_iteration"], first["ended"]) == (0, reached, "killed")
    resumed = second["first_iteration"]  # the checkpoint of 6, or of 3 if the kill came before 6 was on disk
    assert resumed in (3, 6)
    assert (second["last_iteration"], second["ended"]) == (12, "completed")
    assert second["lost_steps"] == reached - resumed  # trained before the kill, and again after it
    assert second["lost"] == pytest.approx((reached - resumed) * first["productive"] / first["steps"])
    for record in (first, second):  # each run's categories add up to its wall time
        assert sum(record[k] for k in CATEGORIES if k != "lost") == pytest.approx(record["wall"], rel=0.01)
    assert second["checkpoint"] > 0  # the resumed run saved at 9 and 12
    t = totals([first, second])
    assert sum(t[k] for k in CATEGORIES) == pytest.approx(t["wall"], rel=0.01)
    table = goodput_table(tmp_path)
    assert re.search(rf"  1\. iterations 0-{reached}, [\d.]+ s, killed\n", table)
    lost = f", {reached - resumed} steps trained again" if reached > resumed else ""
    assert re.search(rf"  2\. iterations {resumed}-12, [\d.]+ s, completed{lost}\n", table)


def test_ember_goodput_prints_the_table_or_says_there_is_none(tmp_path, capsys):
    assert main(["goodput", str(tmp_path)]) == 2
    assert "No goodput.jsonl in" in capsys.readouterr().err


@pytest.mark.parametrize(
    "line",
    [
        "42",
        "null",
        "[1, 2]",
        "{}",
        '{"run": "x"}',
        '{"run": "x", "time": 1, "wall": "3"}',
        '{"run": "x", "time": true, "wall": 3}',
    ],
)
def test_a_line_that_is_json_but_not_a_record_is_skipped_with_a_warning_naming_it(tmp_path, capsys, line):
    """By `ember goodput` (its table as without the line) and by a relaunch's ledger (it counts on from the records)."""
    from ember.handlers import GoodputLedger

    clock = Clock()
    first = Engine(lambda e, b: setattr(clock, "now", clock.now + 1.0))
    GoodputLedger(tmp_path, clock=clock, started=0.0).attach(first)
    first.run(range(3))
    path = tmp_path / "goodput.jsonl"
    good = path.read_text()
    assert main(["goodput", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    path.write_text(good + line + "\n")
    message = re.escape(f"{path}, line {good.count(chr(10)) + 1}: not a goodput record, skipped: {line}")
    with pytest.warns(RuntimeWarning, match=f"^{message}$"):
        assert main(["goodput", str(tmp_path)]) == 0
    assert capsys.readouterr().out == table
    again = Engine(lambda e, b: setattr(clock, "now", clock.now + 1.0))
    GoodputLedger(tmp_path, clock=clock, started=clock.now).attach(again)
    with pytest.warns(RuntimeWarning, match=f"^{message}$"):
        again.run(range(3))
    with pytest.warns(RuntimeWarning, match=f"^{message}$"):
        records = read_records(tmp_path)
    assert [r["steps"] for r in records] == [3, 3]


def test_the_newest_launch_still_running_reads_as_running_and_only_earlier_ones_as_killed(tmp_path):
    """A launch whose last word is "running" is killed only if a later launch followed it; the newest stays running."""
    lines = [
        {"run": "a", "time": 10.0, "wall": 10.0, "ended": "running"},
        {"run": "b", "time": 30.0, "wall": 5.0, "ended": "completed"},
        {"run": "c", "time": 50.0, "wall": 4.0, "ended": "running"},
    ]
    (tmp_path / "goodput.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [(r["run"], r["ended"]) for r in read_records(tmp_path)] == [
        ("a", "killed"),
        ("b", "completed"),
        ("c", "running"),
    ]


def test_lost_time_is_the_earlier_runs_productive_time_per_step_it_ran_not_per_iteration(tmp_path):
    """A launch ran iterations 10-20 (10 steps, 5 s productive) and died; a relaunch from 15 lost 5 steps: 2.5 s.

    0.5 s for each step it ran, not 5 s over its last iteration (20), which would make 1.25 s.
    """
    import json

    from ember.handlers import GoodputLedger

    earlier = {"run": "dead", "time": 100.0, "wall": 8.0, **dict.fromkeys(CATEGORIES, 0.0), "productive": 5.0}
    earlier.update(first_iteration=10, last_iteration=20, steps=10, lost_steps=0, ended="running")
    (tmp_path / "goodput.jsonl").write_text(json.dumps(earlier) + "\n")
    clock = Clock()
    trainer = Engine(lambda e, b: None)
    trainer.load_state_dict({"iteration": 15, "epoch_length": 20, "max_epochs": 1})
    GoodputLedger(tmp_path, clock=clock, started=0.0).attach(trainer)
    trainer.run(range(20))
    dead, relaunch = read_records(tmp_path)
    assert (dead["ended"], relaunch["first_iteration"], relaunch["lost_steps"]) == ("killed", 15, 5)
    assert relaunch["lost"] == 2.5


def test_compilation_saved_counts_each_hit_at_zero_or_more_never_below(tmp_path):
    """JAX estimates the time a cache hit saved as compile time minus load time: below 0 when loading was slower."""
    import jax

    from ember.handlers import GoodputLedger

    trainer = Engine(lambda e, b: b)
    GoodputLedger(tmp_path).attach(trainer)

    @trainer.on(Events.ITERATION_COMPLETED)
    def hits(engine):
        jax.monitoring.record_event("/jax/compilation_cache/cache_hits")
        saved = {1: 1.5, 2: -0.75, 3: 0.25}[engine.state.iteration]
        jax.monitoring.record_event_duration_secs("/jax/compilation_cache/compile_time_saved_sec", saved)

    trainer.run([0, 1, 2])
    record = read_records(tmp_path)[-1]
    assert (record["cache_hits"], record["cache_saved"]) == (3, 1.75)
    last = goodput_table(tmp_path).splitlines()[-1]
    assert last == "persistent compilation cache: 3 hits, 1.8 s of compilation saved"


def test_a_process_ember_launch_restarted_records_its_restart_in_its_first_run_only(tmp_path, monkeypatch):
    """EMBER_RESTART (restart 1 of 2, the failure 4 s before the process started): the first run's record keeps it.

    The table names it and sums the wait; a second run() in the process, or a malformed variable, records none.
    """
    import time

    from ember.cli._launch import restart_environment
    from ember.handlers import GoodputLedger

    clock = Clock()
    clock.now = 100.0
    born = time.time()  # the process "started" at clock 100: now
    variable = restart_environment(1, 2, "process 1 was lost (SIGKILL)", born - 4.0)
    monkeypatch.setenv("EMBER_RESTART", variable["EMBER_RESTART"])
    trainer = Engine(lambda e, b: b)
    GoodputLedger(tmp_path, clock=clock, started=100.0).attach(trainer)
    trainer.run(range(3))
    first = read_records(tmp_path)[-1]
    assert {k: first["restart"][k] for k in ("number", "of", "cause")} == {
        "number": 1,
        "of": 2,
        "cause": "process 1 was lost (SIGKILL)",
    }
    assert first["restart"]["waited"] == pytest.approx(4.0, abs=1.0)
    trainer.run(range(3), max_epochs=2)  # a later run() in the same process: not a restart
    assert "restart" not in read_records(tmp_path)[-1]
    table = goodput_table(tmp_path)
    assert re.search(
        r"  1\. iterations 0-3, [\d.]+ s, completed; restart 1 of 2 after process 1 was lost \(SIGKILL\), [34]\.\d s "
        r"later\n",
        table,
    )
    assert re.search(
        r"\nrestarts: 1 by ember launch, [34]\.\d s from the failures to the relaunched processes' start \(not in the "
        r"wall time above\)$",
        table,
    )
    monkeypatch.setenv("EMBER_RESTART", '{"number": "one"}')
    other = tmp_path / "other"
    GoodputLedger(other, clock=clock, started=100.0).attach(trainer := Engine(lambda e, b: b))
    trainer.run(range(2))
    assert "restart" not in read_records(other)[-1]
    assert "restarts:" not in goodput_table(other)
