"""``ember eval --watch``: every committed checkpoint of a run evaluated once, in order, through kills."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from ember._run_holder import hold
from ember.cli._distributed import heartbeat_timeout
from ember.cli._evaluations.job import EvaluationJob
from ember.cli._evaluations.saved_steps import saved_before
from ember.cli._schema import WATCHER_NAME


def watch_run(
    run_dir: str | Path,
    name: str,
    overrides: Sequence[str] = (),
    *,
    poll: float = 2.0,
    stream: TextIO | None = None,
) -> dict[str, Any]:
    """``ember eval --watch``: evaluate every committed checkpoint of a run once, in increasing order, until it ends.

    Beside a training run (or after it), in a job of its own, possibly on another device count: every latest
    checkpoint of the run folder that is committed (never one being written) is evaluated as ``ember eval`` does, its
    metrics written at the checkpoint's step as ``NAME/val/accuracy`` by the run's writers (``handlers.writers``, as
    [`create_run_writer`][ember.writers.create_run_writer]``(evaluation=NAME)`` makes them: ``RUN_DIR/eval/NAME/``'s
    ``metrics.jsonl``, ``metrics.csv`` and ``tb``, the run's MLflow run, a W&B run in the run's group). What
    was evaluated is kept in ``RUN_DIR/eval/NAME/watch.json``, written atomically after the metrics are on disk:
    a watcher killed and relaunched evaluates none twice and skips none (a record past its last evaluated step is
    dropped first). A checkpoint that retention deleted before it could be read is reported, on the console and in
    ``watch.json`` (``missed``): each latest checkpoint names the steps saved before it (`SavedSteps`), so one deleted
    before the watcher ever listed it is reported too, as is the run's last (its step is the summary's); one the
    best store also holds is read from there. A damaged checkpoint is reported as damaged, with the store's words
    (the file and the check), in ``watch.json``'s ``damaged``, and left where it is. The watcher ends once the run is
    complete (its ``summary.json`` says it ended other than by a signal) and every checkpoint is evaluated or
    reported; it looks every ``poll`` seconds. One watcher of a name runs at a time: a second is refused with
    [`RunHeldError`][ember.errors.RunHeldError] (``RUN_DIR/eval/NAME/held-by.json`` names the first); watchers of
    other names run beside it.

    Returns:
        ``{"evaluated": [steps], "missed": [steps]}``, as ``watch.json`` holds them, with ``"damaged": {step: why}``
        when some of the missed were damaged rather than deleted.
    """
    if not isinstance(name, str) or not re.fullmatch(WATCHER_NAME, name):
        raise ValueError(f"`--name` must be a name of letters, digits, '_', '.' and '-', got {name!r}.")
    job = EvaluationJob(run_dir, overrides)
    folder = job.run / "eval" / name
    with hold(folder, f"watcher {name!r}"):  # one watcher of a name at a time; others beside it
        return _watch(job, name, folder, poll, stream)


def _watch(job: EvaluationJob, name: str, folder: Path, poll: float, stream: TextIO | None) -> dict[str, Any]:
    """`watch_run` once this watcher holds its folder."""
    import jax

    from ember._atomic_file import replace_file
    from ember.handlers import ProcessWatchdog
    from ember.writers import create_run_writer

    primary = jax.process_index() == 0  # it decides, and writes; every process evaluates
    state = _watched(folder)
    record = None  # made at the first evaluation, once the training job has made its tracker runs
    listed: dict[int, Any] = {}  # on process 0: committed when listed, not yet evaluated (deleted since: missed)
    # a lost or stalled process ends the others (status 75), not a hang
    with ProcessWatchdog(answer_within=heartbeat_timeout() / 2).watching():
        while True:
            ended, step, info = _next_step(job.run, name, state, listed)
            if step is None:
                if ended:
                    break
                time.sleep(poll)
                continue
            read, damage = _restored(job, step, info)
            if read is None:  # deleted (retention) before it was read, or damaged, on any process
                if primary:
                    why = "deleted before it was evaluated" if damage is None else f"damaged, not evaluated ({damage})"
                    print(f"step_{step:08d}: {why}; reported in watch.json", file=stream)
                state["missed"].append(step)
                if damage is not None:
                    state.setdefault("damaged", {})[str(step)] = damage
            else:
                metrics = job.run_all(read, stream)
                if record is None:
                    kinds = [w for w in job.cfg.handlers.writers if w != "console"]  # the watcher prints its own
                    record = create_run_writer(job.run, kinds, params=job.cfg, evaluation=name)
                    record.resume_at(max(state["evaluated"], default=-1))  # a record not marked evaluated goes
                record.write_scalars(step, {f"{name}/{k}": v for k, v in metrics.items()})
                record.sync()  # on disk before watch.json says the step is done
                state["evaluated"].append(step)
            if primary:
                replace_file(folder, "watch.json", json.dumps(state))
    if record is not None:
        record.close()
    if primary:
        _release(job, name, stream)
    return state


def _release(job: EvaluationJob, name: str, stream: TextIO | None) -> None:
    """The run has ended: what it kept past ``keep_latest`` for its watchers goes, once all of them have read it.

    No save of the run is left to remove those checkpoints; a watcher the run names in ``keep_for_watchers``, at its
    end, removes those that every one of them has evaluated (or reported missed).
    """
    from ember.checkpoint import open_store

    kept = job.cfg.handlers.checkpoint
    if name not in kept.keep_for_watchers:
        return
    held = unread_by(job.run, kept.keep_for_watchers)
    older = sorted(_committed(job.run).items())[: -kept.keep_latest]
    gone = [info for step, info in older if not held(step)]
    for info in gone:
        open_store(job.run / "checkpoints" / "latest").delete(info)
    if gone:
        what = f"{len(gone)} checkpoint{'s' if len(gone) > 1 else ''}"
        print(f"Removed {what} kept for the watchers until read: {[i.step for i in gone]}.", file=stream)


def _next_step(run: Path, name: str, state: dict[str, Any], listed: dict[int, Any]) -> tuple[bool, int | None, Any]:
    """Whether the run has ended, and the next checkpoint to evaluate (its step and its info here).

    Process 0 decides, from what it has ever listed (``listed``: a checkpoint deleted since is tried, and reported
    missed) and the steps the newly listed ones say were saved before them (one not listed was deleted first: it is
    tried too), and every process takes its answer; another process looks the step up in its own listing (``None``
    if it does not hold it). The run's end is read before the listing: every checkpoint of an ended run is in it.
    """
    import jax

    from ember._multiprocess import exchange

    answer, info = "[false, null]", None
    if jax.process_index() == 0:
        final = _final_step(run)
        ended = final is not None
        last = max(state["evaluated"] + state["missed"], default=-1)
        fresh = {step: info for step, info in _committed(run).items() if step > last and step not in listed}
        listed.update(fresh)
        if final is not None and final > last and final not in listed:  # the run's last, which no later one names:
            listed[final] = None  # it was saved (the run saves at its end), so it is tried, and reported if it fails
        gone = {s for i in fresh.values() for s in saved_before(i.manifest) if s > last and s not in listed}
        if gone:  # saved before a checkpoint listed now, yet not listed: deleted, unless this listing missed it
            again = _committed(run)  # committed before the one that names it: a second listing holds it, if kept
            listed.update({step: again.get(step) for step in gone})
        first = min(listed, default=None)
        info = listed.pop(first) if first is not None else None
        answer = json.dumps([ended, first])
    ended, step = json.loads(exchange(f"watch {run.resolve()} {name}", answer)[0])
    if step is not None and jax.process_index() != 0:
        info = _committed(run).get(step)
    return bool(ended), step, info


def _restored(job: EvaluationJob, step: int, info: Any) -> tuple[Any, str | None]:
    """Restore the checkpoint of ``step``: ``info`` (``None``: not listed here), else the best store's of that step.

    Returns what was restored here, or ``None`` when a process could restore neither (deleted or damaged there), and
    why it could not be read here if it is damaged (the file and the check, as the store says it), else ``None``.
    The run's folder is the training job's: a damaged checkpoint is reported, never moved.
    """
    from ember._multiprocess import any_process
    from ember.checkpoint import CorruptCheckpointError, open_store

    def copies() -> Iterator[Any]:  # the best store is listed only when the latest's copy could not be read
        if info is not None:
            yield info
        best = job.run / "checkpoints" / "best"
        if best.is_dir():
            yield from (i for i in open_store(best).checkpoints() if i.step == step)

    read, damage = None, None
    for copy in copies():
        try:
            job.restore(copy)
        except FileNotFoundError:
            continue
        except CorruptCheckpointError as e:
            damage = damage or str(e)
            continue
        read = copy
        break
    if read is None and damage is None:  # never listed: a folder whose files do not check out is damaged
        damage = _damage(job.run / "checkpoints" / "latest" / f"step_{step:08d}")
    return (None if any_process(read is None) else read), damage


def _damage(path: Path) -> str | None:
    """What is wrong with the checkpoint folder ``path`` (the store's words), or ``None`` if it is not there."""
    from ember.checkpoint import open_store

    if not path.is_dir():
        return None
    try:
        open_store(path.parent).verify(path, full=True)
    except (OSError, ValueError) as e:  # CorruptCheckpointError, or no checkpoint of the store's kind
        return str(e)
    return None


def _watched(folder: Path) -> dict[str, Any]:
    """What a watcher evaluated (and missed) before, from its ``watch.json``; nothing for a new one."""
    path = folder / "watch.json"
    if not path.exists():
        return {"evaluated": [], "missed": []}
    try:
        state = json.loads(path.read_text())
    except OSError as e:  # a folder in its place, a file it cannot read: as damaged as a torn one
        raise ValueError(f"{path} cannot be read ({e}); move it aside.") from None
    lists = isinstance(state, dict) and all(isinstance(state.get(k), list) for k in ("evaluated", "missed"))
    if not lists or not all(type(s) is int for k in ("evaluated", "missed") for s in state[k]):
        raise ValueError(f"{path} is not a watcher's state ({{'evaluated': [...], 'missed': [...]}}); move it aside.")
    damaged = state.get("damaged", {})
    if not isinstance(damaged, dict):
        raise ValueError(f"{path} is not a watcher's state ('damaged' must map steps to reasons); move it aside.")
    found: dict[str, Any] = {"evaluated": list(state["evaluated"]), "missed": list(state["missed"])}
    return {**found, "damaged": dict(damaged)} if damaged else found


def unread_by(run: Path, names: Sequence[str]) -> Callable[[int], bool]:
    """``held(step)``: whether a watcher of ``names`` has yet to evaluate (or report missed) the checkpoint of ``step``.

    Read from each watcher's ``watch.json`` at every call (a save's retention; never on the hot path). A watcher that
    has not started, or whose state cannot be read, has read nothing: every checkpoint is held for it.

    Examples:
        >>> import json, pathlib, tempfile
        >>> from ember.cli._evaluations.watcher import unread_by
        >>> run = pathlib.Path(tempfile.mkdtemp())
        >>> (run / "eval" / "w").mkdir(parents=True)
        >>> _ = (run / "eval" / "w" / "watch.json").write_text(json.dumps({"evaluated": [5, 10], "missed": [15]}))
        >>> held = unread_by(run, ["w"])
        >>> held(15), held(20)
        (False, True)
    """

    def held(step: int) -> bool:
        for name in names:
            try:
                state = _watched(run / "eval" / name)
            except ValueError:  # damaged or torn: what it read is not known, so nothing goes
                return True
            if step > max(state["evaluated"] + state["missed"], default=-1):
                return True
        return False

    return held


def _committed(run: Path) -> dict[int, Any]:
    """The run's committed latest checkpoints by step.

    The latest store's one writer commits them in increasing order, so a step below one already listed never
    appears later: the watcher's order and its exactly-once rest on that. (The best store's saves come from another
    writer, which may commit an older step after a newer latest one.)
    """
    from ember.checkpoint import open_store

    folder = run / "checkpoints" / "latest"
    return {info.step: info for info in open_store(folder).checkpoints()} if folder.is_dir() else {}


def _final_step(run: Path) -> int | None:
    """The last iteration of the training run if it has ended for good (a ``summary.json`` no signal stopped)."""
    from ember.cli._run_record import stopped_by_signal

    path = run / "summary.json"
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
    except ValueError:  # being written
        return None
    if stopped_by_signal(summary):
        return None
    final = summary.get("iterations")
    return final if type(final) is int else -1
