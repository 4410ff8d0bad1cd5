"""Training: `TrainState`, compiled steps from a loss function, placement on devices, trainers."""

from ember.training._devices.placement import DataParallel, Placement, Pmap, SingleDevice, default_placement
from ember.training._devices.plan import MemoryPlan
from ember.training._devices.sharded import Sharded, fsdp
from ember.training._lr_finder import LRFinderResult, lr_find
from ember.training._step.ema import ema, ema_params
from ember.training._step.guard import StepGuard
from ember.training._step.loss_scale import DynamicLossScale
from ember.training._step.plateau import ReduceLROnPlateau, scale_by_plateau
from ember.training._step.steps import BoundModel, make_eval_step, make_train_step
from ember.training._step_output import StepOutput
from ember.training._supervised import create_supervised_evaluator, create_supervised_trainer
from ember.training._train_state import TrainState
from ember.training._trainer import create_evaluator, create_trainer
from ember.training._training_engine import TrainingEngine
from ember.training._training_state import TrainingState

__all__ = [
    "BoundModel",
    "DataParallel",
    "DynamicLossScale",
    "LRFinderResult",
    "MemoryPlan",
    "Placement",
    "Pmap",
    "ReduceLROnPlateau",
    "Sharded",
    "SingleDevice",
    "StepGuard",
    "StepOutput",
    "TrainState",
    "TrainingEngine",
    "TrainingState",
    "create_evaluator",
    "create_supervised_evaluator",
    "create_supervised_trainer",
    "create_trainer",
    "default_placement",
    "ema",
    "ema_params",
    "fsdp",
    "lr_find",
    "make_eval_step",
    "make_train_step",
    "scale_by_plateau",
]
