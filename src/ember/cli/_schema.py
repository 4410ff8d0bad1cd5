"""The `ember train` configuration's schema: typed sections, each field with its default (the digits run)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

#: what names an ``ember eval --watch`` job (``--name``): its folder ``RUN_DIR/eval/NAME`` and its tracker runs
WATCHER_NAME = r"[A-Za-z0-9_.-]+"


@dataclass(frozen=True)
class Rule:
    """A field's check beyond its type, written beside the field (``Annotated[int, Rule(...)]``): what it expects."""

    expected: str
    holds: Callable[[Any], bool]


Positive = Annotated[int, Rule("a positive int", lambda v: v >= 1)]
Folder = Annotated[str, Rule("a folder path", lambda v: bool(v.strip()))]  # an empty one: the working folder
Seconds = Annotated[float, Rule("a positive number of seconds", lambda v: v > 0)]
SecondsOrNull = Annotated[float, Rule("a positive number of seconds (or null)", lambda v: v > 0)]


@dataclass
class ModelConfig:
    """The model: a registered name (``cnn``, ``mlp``) or an import path ``package.module:Class``."""

    name: str = "cnn"
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimizerConfig:
    """An optax optimizer with a schedule and the usual transforms."""

    name: Literal["adamw", "adam", "sgd", "lamb"] = "adamw"
    learning_rate: Annotated[float, Rule("a positive number", lambda v: v > 0)] = 3e-3
    schedule: Literal["constant", "cosine", "warmup_cosine"] = "cosine"
    warmup_steps: Annotated[int, Rule("an int >= 0", lambda v: v >= 0)] = 0
    weight_decay: Annotated[float, Rule("a number >= 0", lambda v: v >= 0)] = 1e-4
    clip_norm: Annotated[float, Rule("a positive number (or null for no clipping)", lambda v: v > 0)] | None = 1.0
    momentum: Annotated[float, Rule("a number in [0, 1)", lambda v: 0 <= v < 1)] = 0.9
    #: keep an exponential moving average of the parameters (``ember.training.ema``), moving by this much each step
    #: (0.001: a decay of 0.999); the validations and the best checkpoints then judge the average, and ``ember
    #: export --ema`` writes it
    ema: Annotated[float, Rule("a number in (0, 1) (or null for none)", lambda v: 0 < v < 1)] | None = None


@dataclass
class DataConfig:
    """The data: ``digits``, or your own from a folder of ``.npy`` files (``npy``) or a function (``grain``).

    ``digits`` is scikit-learn's 1,797 handwritten 8x8 digits, shipped with it; ``npy`` reads ``x.npy`` and
    ``y.npy`` from disk as needed, so they may be larger than memory; ``grain`` calls your function for
    your own Grain pipeline.
    """

    name: Literal["digits", "npy", "grain"] = "digits"
    #: ``npy``: the folder holding ``x.npy`` and ``y.npy``; ``grain``: ``package.module:function``, called
    #: with ``batch_size`` and ``seed``, returning ``(train, val)`` iterables of ``{"x": ..., "y": ...}`` batches.
    path: str | None = None
    batch_size: Positive = 64
    #: ``digits`` and ``npy``: the part of the examples held out for validation.
    val_fraction: Annotated[float, Rule("a number in (0, 1)", lambda v: 0 < v < 1)] = 0.2
    seed: int = 0
    #: ``npy``: Grain worker processes that read the records (0: this process reads them).
    worker_count: int = 0
    #: ``grain``: batches per epoch, for training data without a ``len()``.
    epoch_length: Positive | None = None


@dataclass
class TrainerConfig:
    """How long and where to train."""

    max_epochs: Positive = 15
    max_iters: Positive | None = None
    steps_per_call: Positive = 1
    placement: Literal["auto", "single", "data_parallel", "pmap", "fsdp", "sharded"] = "auto"
    #: Lightning's names (``create_trainer(precision=)``): float32; bfloat16 compute with float32 parameters;
    #: everything in bfloat16; float16 compute with float32 parameters and dynamic loss scaling.
    precision: Literal["32-true", "bf16-mixed", "bf16-true", "16-mixed"] = "32-true"
    #: recompute the forward pass in the backward by JAX's checkpoint policy name (``create_trainer(remat=)``).
    remat: Literal["full", "dots_saveable", "dots_with_no_batch_dims_saveable", "nothing_saveable"] | None = None
    #: skip an update whose loss or gradients are not finite, inside the step (``create_trainer(skip_nonfinite=)``).
    skip_nonfinite: bool = False
    #: with ``skip_nonfinite``: skip an update whose loss or gradient norm exceeds this times its running average.
    spike_factor: Annotated[float, Rule("a number > 1 (or null)", lambda v: v > 1)] | None = None
    #: with ``skip_nonfinite``: roll back to the latest checkpoint after this many skipped steps in a row (null: never).
    rollback_after: Positive | None = 3
    #: JAX's persistent compilation cache, so a relaunch does not compile again: ``auto`` (the user's cache folder,
    #: ``$XDG_CACHE_HOME/ember/jax`` or ``~/.cache/ember/jax``), a folder, or null (off). A cache JAX was already
    #: given (JAX_COMPILATION_CACHE_DIR) is kept.
    compilation_cache: str | None = "auto"
    seed: int = 0
    eval_every: Positive = 1
    #: for ``placement: sharded``: mesh axis -> size, in order (``{fsdp: 2, model: 4}``); sizes multiply to the
    #: device count. An axis named ``fsdp`` gets the automatic FSDP rule.
    mesh: dict[str, int] | None = None
    #: for ``fsdp`` and ``sharded``: ``[regex, axis or null, ...]`` per rule, matched on parameter paths.
    rules: list[list[str | None]] = field(default_factory=list)


@dataclass
class CheckpointConfig:
    """Latest and best checkpoints (best by the validation metric of early stopping)."""

    keep_latest: Positive = 2
    keep_best: Positive = 1
    every_iters: Positive | None = None
    #: a folder on fast local storage (``/dev/shm``, a node's NVMe): every latest checkpoint is written there, into
    #: ``<fast_dir>/latest-<the durable tier's id>``, and every ``durable_every``-th one and the last also into the run
    #: folder (``ember.checkpoint.TieredStore``); null: the run folder only. A file, the run folder, a folder inside or
    #: around it, or one that cannot be written is refused before the run starts.
    fast_dir: Folder | None = None
    durable_every: Positive = 5
    #: the evaluation whose accuracy picks the best checkpoints: ``val``, or a name in ``evaluations``.
    best_on: str = "val"
    #: ``ember eval --watch`` jobs by ``--name``: a latest checkpoint past ``keep_latest`` is not deleted until each
    #: has evaluated it (or reported it missed); it goes at the first save after. A watcher never started keeps all.
    keep_for_watchers: list[str] = field(default_factory=list)


@dataclass
class EarlyStoppingConfig:
    """Stop when the validation metric has not improved for ``patience`` evaluations."""

    patience: Positive = 5
    metric: Literal["accuracy", "loss"] = "accuracy"
    threshold: float = 0.0  # the least change that counts as an improvement (Ignite's name)
    #: the evaluation whose ``metric`` is watched: ``val``, or a name in ``evaluations``.
    on: str = "val"


@dataclass
class StallConfig:
    """End a run that stops making progress with its stacks on disk and exit status 75 (``StallWatchdog``)."""

    step_timeout: Seconds = 600.0  # seconds an iteration (or an evaluation's iteration) may take
    startup_timeout: Seconds = 1800.0  # seconds until the first iteration completes (compilation included)
    save_timeout: SecondsOrNull | None = None  # seconds a background checkpoint write may take


@dataclass
class StragglersConfig:
    """Name the process of a multi-process run that holds the others back (``StragglerReport``; one process: none)."""

    every: Positive = 100  # iterations in a window (and each epoch's end)
    #: how many times the others' median time outside the step makes a process lag
    factor: Annotated[float, Rule("a number above 1", lambda v: v > 1)] = 2.0
    patience: Positive = 3  # windows in a row a process must lag to be named


@dataclass
class HandlersConfig:
    """What runs beside training."""

    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    early_stopping: EarlyStoppingConfig | None = field(default_factory=EarlyStoppingConfig)
    progress: bool = True
    # WRITERS' names (ember.writers), written out so that checking a config imports no JAX; a test holds them equal
    writers: list[Literal["console", "tensorboard", "jsonl", "csv", "wandb", "mlflow"]] = field(
        default_factory=lambda: ["tensorboard", "jsonl"]
    )
    log_every: Positive = 50
    #: every this many iterations a histogram of each parameter (TensorBoard's Histograms tab); ``null``: none.
    histograms: Positive | None = None
    #: the config's hyperparameters in TensorBoard's HParams tab, with the last validation numbers, at the run's end.
    hparams: bool = True
    #: a StallWatchdog (``{}`` for its defaults); ``null``: none.
    stall: StallConfig | None = None
    #: the processes' step times and times outside it compared, a laggard named (``stragglers/...``); ``null``: none.
    stragglers: StragglersConfig | None = field(default_factory=StragglersConfig)


@dataclass
class InitConfig:
    """Start the run from another run's weights (``ember.checkpoint.init_from``), at its first launch only.

    A relaunch resumes from the run's own newest checkpoint, never from the source again.
    """

    #: a run folder, a folder of checkpoints, one checkpoint, or an ``ember export`` file (.msgpack, .safetensors).
    source: Annotated[str, Rule("a path to a run, a checkpoint or a weights file", lambda v: bool(v.strip()))] = ""
    #: what of the train state to take: the parameters (a new optimizer), with the optimizer state, or all of it.
    take: Literal["params", "params_and_opt_state", "all"] = "params"
    #: subtrees left at their fresh initialisation (a new head: ``[params.Dense_1]``).
    fresh: list[str] = field(default_factory=list)
    #: the source's leaf names mapped first: a regular expression to its replacement.
    rename: dict[str, str] = field(default_factory=dict)
    #: of a run or a folder of checkpoints: ``latest``, ``best``, or a step.
    checkpoint: Literal["latest", "best"] | Positive = "latest"
    #: false: a leaf the source lacks is left fresh (and said), not refused.
    strict: bool = True


@dataclass
class EvaluationConfig:
    """One more evaluation beside ``val`` (``evaluations:`` maps its name to this): its examples and its schedule.

    Its accuracy and loss are written as ``<name>/accuracy`` and ``<name>/loss`` at the trainer's iteration, beside
    ``val/...``; ``handlers.checkpoint.best_on: <name>`` keeps the best checkpoints by its accuracy.
    """

    #: ``val``: the held-out examples of ``data``; else a folder holding ``x.npy`` and ``y.npy`` (every example).
    data: str = "val"
    #: the standard deviation of Gaussian noise added to the inputs (the same at every evaluation); 0: none.
    noise: Annotated[float, Rule("a number >= 0", lambda v: v >= 0)] = 0.0
    #: every this many epochs; null: by ``every_iters`` only.
    every_epochs: Positive | None = 1
    #: every this many iterations too; null: by epochs only.
    every_iters: Positive | None = None
    #: every this many seconds too, at the end of an iteration (by the clock: a relaunch does not repeat the times).
    every_secs: SecondsOrNull | None = None
    #: once at each of these iterations too.
    at_iters: list[int] = field(default_factory=list)


@dataclass
class Config:
    """Everything ``ember train`` needs; every field has a default (the embedded digits run).

    Examples:
        >>> from ember.cli import Config
        >>> Config().model.name, Config().trainer.max_epochs
        ('cnn', 15)
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    handlers: HandlersConfig = field(default_factory=HandlersConfig)
    #: more evaluations beside ``val``, by name (``{val_noisy: {noise: 0.3, every_iters: 100}}``).
    evaluations: dict[str, EvaluationConfig] = field(default_factory=dict)
    #: start from another run's weights at the first launch (``{source: runs/digits, fresh: [params.Dense_1]}``).
    init: InitConfig | None = None
    name: str = "ember"  # the family of runs: the MLflow experiment and the W&B project each run logs to
    output: Folder = "runs/digits"
