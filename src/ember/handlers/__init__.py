"""Stock handlers: what a run reports and decides."""

from ember.handlers._checkpoint import Checkpoint
from ember.handlers._common import setup_common_training_handlers
from ember.handlers._early_stopping import EarlyStopping
from ember.handlers._epoch_outputs import EpochOutputStore
from ember.handlers._evaluation import Evaluate
from ember.handlers._goodput import GoodputLedger
from ember.handlers._handler_times import HandlersTimeProfiler
from ember.handlers._layers import GradsHistHandler, GradsScalarHandler, WeightsHistHandler, WeightsScalarHandler
from ember.handlers._loading import load_objects
from ember.handlers._logging import ScalarLogger, attach_writer
from ember.handlers._lr_monitor import LRMonitor
from ember.handlers._model_checkpoint import ModelCheckpoint
from ember.handlers._optuna import OptunaPruning
from ember.handlers._preemption import Preemption
from ember.handlers._profiler import Profiler
from ember.handlers._progress import ProgressBar
from ember.handlers._readers import CheckpointReader, HighestCheckpointReader, LowestCheckpointReader
from ember.handlers._rollback import Rollback, RollbackOnDivergence
from ember.handlers._save_handlers import BaseSaveHandler, SaveHandler
from ember.handlers._savers import DiskSaver, global_step_from_engine
from ember.handlers._stall import StallWatchdog
from ember.handlers._statistics import GradientSpikeMonitor, ParamStats, count_parameters
from ember.handlers._terminate_on_nan import NonFiniteError, TerminateOnNan
from ember.handlers._throughput import Throughput
from ember.handlers._timing import TimeLimit, Timer
from ember.handlers._watchdog import ProcessWatchdog

__all__ = [
    "BaseSaveHandler",
    "Checkpoint",
    "CheckpointReader",
    "DiskSaver",
    "EarlyStopping",
    "EpochOutputStore",
    "Evaluate",
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
    "Profiler",
    "ProgressBar",
    "Rollback",
    "RollbackOnDivergence",
    "SaveHandler",
    "ScalarLogger",
    "StallWatchdog",
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
