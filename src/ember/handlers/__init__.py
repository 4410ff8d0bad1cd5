"""Stock handlers: what a run reports and decides."""

from ember.errors import ProcessesMissing
from ember.handlers._checkpointing.checkpoint import Checkpoint, CheckpointEvents
from ember.handlers._checkpointing.loading import load_objects
from ember.handlers._checkpointing.model_checkpoint import ModelCheckpoint
from ember.handlers._checkpointing.readers import CheckpointReader, HighestCheckpointReader, LowestCheckpointReader
from ember.handlers._checkpointing.save_handlers import BaseSaveHandler, SaveHandler
from ember.handlers._checkpointing.savers import DiskSaver, global_step_from_engine
from ember.handlers._common import setup_common_training_handlers
from ember.handlers._early_stopping import EarlyStopping
from ember.handlers._evaluation import Evaluate
from ember.handlers._evaluations import Evaluations
from ember.handlers._optuna import OptunaPruning
from ember.handlers._reporting.basic_profiler import BasicTimeProfiler
from ember.handlers._reporting.epoch_outputs import EpochOutputStore
from ember.handlers._reporting.goodput import GoodputLedger
from ember.handlers._reporting.handler_times import HandlersTimeProfiler
from ember.handlers._reporting.layers import (
    GradsHistHandler,
    GradsScalarHandler,
    WeightsHistHandler,
    WeightsScalarHandler,
)
from ember.handlers._reporting.loggers import ScalarLogger, attach_writer
from ember.handlers._reporting.lr_monitor import LRMonitor
from ember.handlers._reporting.model_statistics import GradientSpikeMonitor, ParamStats, count_parameters
from ember.handlers._reporting.profiler import Profiler
from ember.handlers._reporting.progress import ProgressBar
from ember.handlers._reporting.stragglers import StragglerReport
from ember.handlers._reporting.throughput import Throughput
from ember.handlers._resilience.preemption import Preemption
from ember.handlers._resilience.rollback import Rollback, RollbackOnDivergence
from ember.handlers._resilience.stall import StallWatchdog
from ember.handlers._resilience.terminate_on_nan import NonFiniteError, TerminateOnNan
from ember.handlers._resilience.watchdog import ProcessWatchdog
from ember.handlers._timing import TimeLimit, Timer

__all__ = [
    "BaseSaveHandler",
    "BasicTimeProfiler",
    "Checkpoint",
    "CheckpointEvents",
    "CheckpointReader",
    "DiskSaver",
    "EarlyStopping",
    "EpochOutputStore",
    "Evaluate",
    "Evaluations",
    "GoodputLedger",
    "GradientSpikeMonitor",
    "GradsHistHandler",
    "GradsScalarHandler",
    "HandlersTimeProfiler",
    "HighestCheckpointReader",
    "LRMonitor",
    "LowestCheckpointReader",
    "ModelCheckpoint",
    "NonFiniteError",
    "OptunaPruning",
    "ParamStats",
    "Preemption",
    "ProcessWatchdog",
    "ProcessesMissing",
    "Profiler",
    "ProgressBar",
    "Rollback",
    "RollbackOnDivergence",
    "SaveHandler",
    "ScalarLogger",
    "StallWatchdog",
    "StragglerReport",
    "TerminateOnNan",
    "Throughput",
    "TimeLimit",
    "Timer",
    "WeightsHistHandler",
    "WeightsScalarHandler",
    "attach_writer",
    "count_parameters",
    "global_step_from_engine",
    "load_objects",
    "setup_common_training_handlers",
]
