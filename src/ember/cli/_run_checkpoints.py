"""The checkpoints of an `ember train` run: the best, the latest (in one tier or two), and the one it starts from."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ember import Engine, Events
from ember.checkpoint import TieredStore, open_store
from ember.checkpoint._fast_owner import fast_folder
from ember.cli._evaluations.saved_steps import KEY, SavedSteps, kept_in
from ember.cli._evaluations.watcher import unread_by
from ember.cli._schema import CheckpointConfig, InitConfig
from ember.handlers import Checkpoint, global_step_from_engine
from ember.writers import Writer


def attach_checkpoints(
    config: CheckpointConfig,
    run_dir: Path,
    to_save: dict[str, Any],
    trainer: Engine,
    evaluator: Engine,
    records: Writer | None = None,
    carried: Mapping[str, Any] | None = None,
) -> tuple[Checkpoint, Checkpoint]:
    """Attach ``checkpoints/best`` (by ``evaluator``'s accuracy) and ``checkpoints/latest`` (each epoch, the end).

    ``evaluator`` is the evaluation ``best_on`` names; the latest are also saved every ``every_iters`` iterations.
    A latest checkpoint the watchers of ``keep_for_watchers`` have not read yet is kept past ``keep_latest``; each
    latest checkpoint lists the steps saved into ``checkpoints/latest`` before it (`SavedSteps`), so a watcher reports
    the checkpoints retention deleted before it could read them.

    With ``fast_dir``, the latest go through a `TieredStore` whose durable tier is ``checkpoints/latest``, its fast
    checkpoints in a folder of ``fast_dir`` named after that tier (two runs never share one, though their folders
    have the same name). ``records``, the run's writer, is synced (flushed and fsynced) before each
    latest save: a relaunch, after a SIGKILL or a power loss, resumes from a checkpoint whose steps' records are all
    in the files. ``carried`` names what else the latest checkpoints keep for the run (its last evaluation), each
    unless the run was begun without it (`kept_in`). Returns ``(best, latest)``.
    """
    best = Checkpoint(
        to_save,
        run_dir / "checkpoints" / "best",
        n_saved=config.keep_best,
        score_function=lambda e: e.state.metrics["accuracy"],
        score_name=f"{config.best_on}_accuracy",
        global_step_transform=global_step_from_engine(trainer, Events.ITERATION_COMPLETED),  # the trainer's step
    )
    best.attach(evaluator, Events.COMPLETED)
    latest_dir = latest_store(config, run_dir)
    held = unread_by(run_dir, config.keep_for_watchers) if config.keep_for_watchers else None  # until watchers read
    saved_steps = SavedSteps(run_dir / "checkpoints" / "latest", latest_dir, trainer)  # the steps saved before each
    tiers, carried = _tiers(latest_dir), {KEY: saved_steps, **(carried or {})}
    latest_saves = {**to_save, **{k: v for k, v in carried.items() if kept_in(k, *tiers)}}  # not if begun without
    latest = Checkpoint(latest_saves, latest_dir, n_saved=config.keep_latest, keep_while=held)
    if KEY in latest_saves:
        latest.add_save_listener(saved_steps.saved)
    every = Events.EPOCH_COMPLETED | Events.COMPLETED
    if config.every_iters:
        every = every | Events.ITERATION_COMPLETED(every=config.every_iters)
    if records is not None:  # what was logged up to this step is on disk (fsynced) before the checkpoint of it exists
        trainer.add_event_handler(every, lambda: records.sync())
    latest.attach(trainer, every)
    return best, latest


def fast_tier(config: CheckpointConfig, run_dir: Path) -> Path | None:
    """The folder of the run's fast tier, ``fast_dir``, once checked (`fast_folder`).

    ``None`` for a run without one (no ``fast_dir``): the one place ``ember train`` reads ``fast_dir``.

    ``ember train`` calls it before it writes anything into the run folder, so a mistyped ``fast_dir`` (a file, the
    run folder or a folder around it, one that cannot be written) is refused in one line and the corrected command
    starts the run afresh.
    """
    if config.fast_dir is None:
        return None
    return fast_folder("handlers.checkpoint.fast_dir", config.fast_dir, {"the run folder": run_dir.resolve()})


def latest_store(config: CheckpointConfig, run_dir: Path) -> Path | TieredStore:
    """Where the run's latest checkpoints go: ``checkpoints/latest``, or with ``fast_dir`` a `TieredStore` over it.

    With a fast tier, every save goes into local storage and every ``durable_every``-th and the last into the run
    folder too.
    """
    latest = run_dir / "checkpoints" / "latest"
    fast = fast_tier(config, run_dir)
    return latest if fast is None else TieredStore(fast, latest, durable_every=config.durable_every)


def _tiers(latest: Path | TieredStore) -> tuple[Any, ...]:
    """The stores the run's latest checkpoints are in, as they stand (none for a run folder without any)."""
    if isinstance(latest, TieredStore):
        return latest.fast, latest.durable
    return (open_store(latest),) if latest.is_dir() else ()


def close_stores(*savers: Checkpoint) -> None:
    """Close the stores of ``savers`` (their writer threads end with the run: a notebook runs many)."""
    for saver in savers:
        if saver.store is not None:
            saver.store.close()


def start_from(init: InitConfig | None, trainer: Any, run_dir: Path, config: CheckpointConfig) -> Any:
    """``init:``: the source's weights put into ``trainer``'s state at the run's first launch; the report, or ``None``.

    A run with a checkpoint of its own (in ``checkpoints/latest``, or only in its fast tier so far) is a relaunch: it
    resumes from its own newest checkpoint and the source is not read again (it may be gone by then). A source that
    does not fit raises, before anything of the run is written. The report (`ember.checkpoint.InitReport`) is written
    to ``RUN_DIR/init.json`` by the caller.
    """
    if init is None:
        return None
    if (run_dir / "checkpoints" / "latest").is_dir():  # saved before? every process asks its tiers together
        store = latest_store(config, run_dir)
        if (store if isinstance(store, TieredStore) else open_store(store)).latest() is not None:
            return None
    from ember.checkpoint import init_from

    state, report = init_from(
        trainer.state.train_state,
        init.source,
        take=init.take,
        rename=init.rename,
        fresh=init.fresh,
        strict=init.strict,
        checkpoint=init.checkpoint,
    )
    trainer.state.train_state = state
    return report
