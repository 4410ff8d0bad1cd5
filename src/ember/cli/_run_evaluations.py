"""The `evaluations:` section of an `ember train` run: more evaluations beside ``val``, each with its data."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import optax

from ember import Events
from ember.cli._schema import WATCHER_NAME, Config, EvaluationConfig
from ember.data import Masked
from ember.errors import ConfigError
from ember.metrics import Accuracy, Loss
from ember.training import create_evaluator

#: ``name -> (evaluator, data, schedule)``
Extra = dict[str, tuple[Any, Any, Any]]


def build_evaluations(cfg: Config, trainer: Any, val: Any, predict: Any) -> Extra:
    """Each evaluation of ``cfg.evaluations``: an evaluator of accuracy and loss, its data and its schedule."""
    extra: Extra = {}
    for name, evaluation in cfg.evaluations.items():
        evaluator = classifier_evaluator(cfg, trainer, predict)
        extra[name] = (evaluator, evaluation_data(cfg, name, evaluation, val), schedule_of(evaluation))
    return extra


def classifier_evaluator(cfg: Config, trainer: Any, predict: Any) -> Any:
    """An evaluator of ``trainer``'s model with the run's placement and precision: its accuracy and loss."""
    evaluator = create_evaluator(trainer, predict, placement=trainer.placement, precision=cfg.trainer.precision)
    Accuracy().attach(evaluator, "accuracy")
    Loss(optax.softmax_cross_entropy_with_integer_labels).attach(evaluator, "loss")
    return evaluator


def schedule_of(evaluation: EvaluationConfig) -> Any:
    """The trainer's events an evaluation runs at: by ``every_epochs``, ``every_iters``, ``every_secs``, ``at_iters``.

    Examples:
        >>> from ember.cli._schema import EvaluationConfig
        >>> from ember.cli._run_evaluations import schedule_of
        >>> schedule_of(EvaluationConfig(every_epochs=None, every_iters=100))
        Events.ITERATION_COMPLETED(every=100)
    """
    events = []
    if evaluation.every_epochs is not None:
        events.append(Events.EPOCH_COMPLETED(every=evaluation.every_epochs))
    if evaluation.every_iters is not None:
        events.append(Events.ITERATION_COMPLETED(every=evaluation.every_iters))
    if evaluation.every_secs is not None:
        events.append(Events.ITERATION_COMPLETED(every_secs=evaluation.every_secs))
    if evaluation.at_iters:
        events.append(Events.ITERATION_COMPLETED(once=sorted(set(evaluation.at_iters))))
    schedule = events[0]
    for event in events[1:]:
        schedule = schedule | event
    return schedule


def evaluation_data(cfg: Config, name: str, evaluation: EvaluationConfig, val: Any) -> Any:
    """An evaluation's batches: the run's validation data, or a folder's ``x.npy`` and ``y.npy``; with its noise."""
    if evaluation.data == "val":
        data = val
    else:
        from ember.data import ArrayDataset

        folder = Path(evaluation.data)
        missing = [f for f in ("x.npy", "y.npy") if not (folder / f).is_file()]
        if missing:
            raise ConfigError(
                f"evaluations.{name}.data: expected 'val' or a folder holding x.npy and y.npy; {folder} lacks "
                f"{', '.join(missing)}."
            )
        arrays = {"x": np.load(folder / "x.npy", mmap_mode="r"), "y": np.load(folder / "y.npy", mmap_mode="r")}
        if len(arrays["x"]) != len(arrays["y"]):
            raise ConfigError(
                f"evaluations.{name}.data: x.npy holds {len(arrays['x'])} examples and y.npy {len(arrays['y'])}."
            )
        data = ArrayDataset(arrays, batch_size=cfg.data.batch_size)
    if evaluation.noise <= 0:
        return data
    from ember.data import ArrayDataset

    if isinstance(data, ArrayDataset):  # the noise drawn once over every example: the same on any number of processes
        x = np.asarray(data.arrays["x"])
        noisy = (x + np.random.default_rng(cfg.data.seed).normal(0.0, evaluation.noise, x.shape)).astype(x.dtype)
        return ArrayDataset({**data.arrays, "x": noisy}, batch_size=data.batch_size)
    return Noisy(data, evaluation.noise, seed=cfg.data.seed)


class Noisy:
    """``data``'s batches with Gaussian noise of deviation ``sigma`` added to ``x``: the same at every pass.

    For data that is not an ``ArrayDataset`` (whose noise is drawn over every example at once): the noise follows the
    batches this process reads, so it depends on the number of processes.

    Examples:
        >>> import numpy as np
        >>> from ember.cli._run_evaluations import Noisy
        >>> noisy = Noisy([{"x": np.zeros((2, 1), np.float32), "y": np.zeros(2)}], 1.0, seed=0)
        >>> first, again = next(iter(noisy))["x"], next(iter(noisy))["x"]
        >>> first.dtype, bool((first == again).all()), bool((first != 0).all())
        (dtype('float32'), True, True)
    """

    def __init__(self, data: Any, sigma: float, *, seed: int) -> None:
        self.data, self.sigma, self.seed = data, sigma, seed

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[Any]:
        rng = np.random.default_rng(self.seed)  # each pass draws the same noise, batch by batch
        for batch in self.data:
            inner = batch.batch if isinstance(batch, Masked) else batch  # a process's padded part of a batch
            x = np.asarray(inner["x"])
            noisy = {**inner, "x": (x + rng.normal(0.0, self.sigma, x.shape)).astype(x.dtype)}
            yield Masked(noisy, batch.mask) if isinstance(batch, Masked) else noisy


def evaluate_run(
    run_dir: str | Path, checkpoint: str = "latest", overrides: Sequence[str] = (), *, stream: TextIO | None = None
) -> dict[str, Any]:
    """``ember eval``: every evaluation of a run (``val`` and its ``evaluations:``) on one of its checkpoints.

    The run's ``config.yaml`` builds the model, the data and the evaluators (``overrides`` change it: another
    placement or device count, a larger batch); ``checkpoint`` is ``latest`` (the newest checkpoint in the run
    folder), ``best`` (the best by the accuracy ``best_on`` names) or a step. The metrics are printed, one line an
    evaluation, and appended to ``RUN_DIR/eval.jsonl`` at the checkpoint's step, as ``name/metric``.

    Returns:
        ``{"step", "checkpoint", "metrics"}``.
    """
    from ember.writers import JsonlWriter

    job = EvaluationJob(run_dir, overrides)
    info = _checkpoint_of(job.run, job.cfg, checkpoint)
    metrics = job.evaluate(info, stream)
    import jax

    if jax.process_index() == 0:  # every process evaluates; one writes
        record = JsonlWriter(job.run / "eval.jsonl")
        record.write_scalars(info.step, metrics)
        record.close()
    return {"step": info.step, "checkpoint": info.path.name, "metrics": metrics}


class EvaluationJob:
    """A run's model and evaluators, built from its ``config.yaml`` in a job of their own (``ember eval``)."""

    def __init__(self, run_dir: str | Path, overrides: Sequence[str] = ()) -> None:
        from ember.cli._config import config_source, importable, load_config
        from ember.cli._registry import build_data
        from ember.cli._run_parts import build_trainer, learning_rates, predict

        self.run = Path(run_dir)
        saved = self.run / "config.yaml"
        if not saved.is_file():
            raise FileNotFoundError(f"{self.run} has no config.yaml; is it a run folder of ember train?")
        self.cfg = cfg = load_config(saved, overrides)
        importable(config_source(saved))
        importable(Path.cwd())
        data, val, sample = build_data(cfg.data)
        self.trainer = build_trainer(cfg, sample, learning_rates(cfg, data)[1])  # the run's optimizer state
        self.runs = {"val": (classifier_evaluator(cfg, self.trainer, predict), val)}
        self.runs |= {n: (e, d) for n, (e, d, _) in build_evaluations(cfg, self.trainer, val, predict).items()}

    def evaluate(self, info: Any, stream: TextIO | None = None) -> dict[str, float]:
        """Restore the checkpoint ``info`` and run every evaluation on it; print a line each; return the metrics."""
        self.restore(info)
        return self.run_all(info, stream)

    def restore(self, info: Any) -> None:
        """Restore the checkpoint ``info`` into the trainer (its train state, onto this job's own placement)."""
        from ember.handlers import load_objects

        load_objects({"trainer": self.trainer}, info.path)

    def run_all(self, info: Any, stream: TextIO | None = None) -> dict[str, float]:
        """Every evaluation on the state restored from ``info``; a line each printed (by process 0); the metrics."""
        import jax

        metrics: dict[str, float] = {}
        for name, (engine, data) in self.runs.items():
            engine.run(data)
            found = {f"{name}/{k}": float(v) for k, v in engine.state.metrics.items()}
            metrics |= found
            shown = "  ".join(f"{k} {v:.4f}" for k, v in found.items())
            if jax.process_index() == 0:
                print(f"{info.path.name} (iteration {info.step}): {shown}", file=stream, flush=True)
        return metrics


def _checkpoint_of(run: Path, cfg: Config, which: str) -> Any:
    """The checkpoint ``which`` (``latest``, ``best``, or a step) names in the run folder ``run``."""
    from ember.checkpoint import open_store

    folders = {kind: run / "checkpoints" / kind for kind in ("latest", "best")}
    stores = {kind: open_store(folder) for kind, folder in folders.items() if folder.is_dir()}
    if which == "latest" or which == "best":
        store = stores.get(which)
        found = None
        if store is not None:
            found = store.latest() if which == "latest" else store.best(f"{cfg.handlers.checkpoint.best_on}_accuracy")
        if found is None:
            raise FileNotFoundError(f"{folders[which]} holds no valid checkpoint to evaluate.")
        return found
    if not which.isdigit():
        raise ValueError(f"`--checkpoint` must be latest, best or a step (an int), got {which!r}.")
    held = [info for store in stores.values() for info in store.checkpoints() if info.step == int(which)]
    if not held:
        steps = sorted({info.step for store in stores.values() for info in store.checkpoints()})
        raise FileNotFoundError(f"{run} holds no checkpoint of step {which}; it holds steps {steps}.")
    return held[0]


def watch_run(
    run_dir: str | Path,
    name: str,
    overrides: Sequence[str] = (),
    *,
    poll: float = 2.0,
    stream: TextIO | None = None,
) -> dict[str, list[int]]:
    """``ember eval --watch``: evaluate every committed checkpoint of a run once, in increasing order, until it ends.

    Beside a training run (or after it), in a job of its own, possibly on another device count: every latest
    checkpoint of the run folder that is committed (never one being written) is evaluated as ``ember eval`` does, its
    metrics written at the checkpoint's step as ``NAME/val/accuracy`` by the run's writers (``handlers.writers``, as
    [`create_run_writer`][ember.writers.create_run_writer]``(evaluation=NAME)`` makes them: ``RUN_DIR/eval/NAME/``'s
    ``metrics.jsonl``, ``metrics.csv`` and ``tb``, the run's MLflow run, a W&B run in the run's group). What
    was evaluated is kept in ``RUN_DIR/eval/NAME/watch.json``, written atomically after the metrics are on disk:
    a watcher killed and relaunched evaluates none twice and skips none (a record past its last evaluated step is
    dropped first). A checkpoint that retention deleted before it could be read is reported, on the console and in
    ``watch.json`` (``missed``). The watcher ends once the run is complete (its ``summary.json`` says it ended
    other than by a signal) and every checkpoint is evaluated; it looks every ``poll`` seconds.

    Returns:
        ``{"evaluated": [steps], "missed": [steps]}``, as ``watch.json`` holds them.
    """
    import jax

    from ember._atomic_file import replace_file
    from ember.handlers import ProcessWatchdog
    from ember.writers import create_run_writer

    if not isinstance(name, str) or not re.fullmatch(WATCHER_NAME, name):
        raise ValueError(f"`--name` must be a name of letters, digits, '_', '.' and '-', got {name!r}.")
    job = EvaluationJob(run_dir, overrides)
    folder = job.run / "eval" / name
    primary = jax.process_index() == 0  # it decides, and writes; every process evaluates
    if primary:
        folder.mkdir(parents=True, exist_ok=True)
    state = _watched(folder)
    record = None  # made at the first evaluation, once the training job has made its tracker runs
    listed: dict[int, Any] = {}  # on process 0: committed when listed, not yet evaluated (deleted since: missed)
    with ProcessWatchdog().watching():  # a lost process ends the others (status 75), not a hang
        while True:
            ended, step, info = _next_step(job.run, name, state, listed)
            if step is None:
                if ended:
                    break
                time.sleep(poll)
                continue
            if not _restored(job, info):  # deleted (retention) or replaced as it was read, on any process
                if primary:
                    print(f"step_{step:08d}: deleted before it was evaluated; reported in watch.json", file=stream)
                state["missed"].append(step)
            else:
                metrics = job.run_all(info, stream)
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
    return state


def _next_step(
    run: Path, name: str, state: dict[str, list[int]], listed: dict[int, Any]
) -> tuple[bool, int | None, Any]:
    """Whether the run has ended, and the next checkpoint to evaluate (its step and its info here).

    Process 0 decides, from what it has ever listed (``listed``: a checkpoint deleted since is tried, and reported
    missed) and every process takes its answer; another process looks the step up in its own listing (``None`` if
    it does not hold it). The run's end is read before the listing: every checkpoint of an ended run is in it.
    """
    import jax

    from ember._multiprocess import exchange

    answer, info = "[false, null]", None
    if jax.process_index() == 0:
        ended = _run_ended(run)
        last = max(state["evaluated"] + state["missed"], default=-1)
        listed.update({step: info for step, info in _committed(run).items() if step > last})
        first = min(listed, default=None)
        info = listed.pop(first) if first is not None else None
        answer = json.dumps([ended, first])
    ended, step = json.loads(exchange(f"watch {run.resolve()} {name}", answer)[0])
    if step is not None and jax.process_index() != 0:
        info = _committed(run).get(step)
    return bool(ended), step, info


def _restored(job: EvaluationJob, info: Any) -> bool:
    """Restore ``info`` (``None``: not listed here); whether every process did (deleted or damaged on none)."""
    from ember._multiprocess import any_process
    from ember.checkpoint import CorruptCheckpointError

    failed = info is None
    if info is not None:
        try:
            job.restore(info)
        except (FileNotFoundError, CorruptCheckpointError):
            failed = True
    return not any_process(failed)


def _watched(folder: Path) -> dict[str, list[int]]:
    """What a watcher evaluated (and missed) before, from its ``watch.json``; nothing for a new one."""
    path = folder / "watch.json"
    if not path.exists():
        return {"evaluated": [], "missed": []}
    state = json.loads(path.read_text())
    if not (isinstance(state, dict) and all(isinstance(state.get(k), list) for k in ("evaluated", "missed"))):
        raise ValueError(f"{path} is not a watcher's state ({{'evaluated': [...], 'missed': [...]}}); move it aside.")
    return {"evaluated": list(state["evaluated"]), "missed": list(state["missed"])}


def unread_by(run: Path, names: Sequence[str]) -> Callable[[int], bool]:
    """``held(step)``: whether a watcher of ``names`` has yet to evaluate (or report missed) the checkpoint of ``step``.

    Read from each watcher's ``watch.json`` at every call (a save's retention; never on the hot path). A watcher that
    has not started, or whose state cannot be read, has read nothing: every checkpoint is held for it.

    Examples:
        >>> import json, pathlib, tempfile
        >>> from ember.cli._run_evaluations import unread_by
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


def _run_ended(run: Path) -> bool:
    """Whether the training run has ended for good: a ``summary.json`` that no signal stopped."""
    from ember.cli._run_record import stopped_by_signal

    path = run / "summary.json"
    if not path.exists():
        return False
    try:
        summary = json.loads(path.read_text())
    except ValueError:  # being written
        return False
    return not stopped_by_signal(summary)
