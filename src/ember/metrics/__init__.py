"""Metrics whose accumulators live on device: Ignite's attach API over mergeable accumulators."""

from ember._protocols import FusableMetric, FusingEngine
from ember.errors import NotComputableError
from ember.metrics._classification import Accuracy, Fbeta, Precision, Recall, TopKAccuracy, TopKCategoricalAccuracy
from ember.metrics._collect import ROC_AUC, Collect, EpochMetric, Last, RocAuc
from ember.metrics._composite import AttachedMetric, MetricsLambda
from ember.metrics._confusion import ConfusionMatrix, IoU, mIoU
from ember.metrics._frequency import Frequency
from ember.metrics._ignite_style import reinit__is_reduced, sync_all_reduce
from ember.metrics._metric import Metric
from ember.metrics._moments import R2Score, Std
from ember.metrics._reductions import Average, Loss, Max, Min, Perplexity, Sum
from ember.metrics._regression import MeanAbsoluteError, MeanSquaredError, RootMeanSquaredError
from ember.metrics._running_average import RunningAverage
from ember.metrics._usage import (
    BATCH_WISE,
    EPOCH_WISE,
    RUNNING_BATCH_WISE,
    RUNNING_EPOCH_WISE,
    SINGLE_EPOCH_RUNNING_BATCH_WISE,
    BatchFiltered,
    BatchWise,
    EpochWise,
    MetricUsage,
    RunningBatchWise,
    RunningEpochWise,
    SingleEpochRunningBatchWise,
)

__all__ = [
    "BATCH_WISE",
    "EPOCH_WISE",
    "ROC_AUC",
    "RUNNING_BATCH_WISE",
    "RUNNING_EPOCH_WISE",
    "SINGLE_EPOCH_RUNNING_BATCH_WISE",
    "Accuracy",
    "AttachedMetric",
    "Average",
    "BatchFiltered",
    "BatchWise",
    "Collect",
    "ConfusionMatrix",
    "EpochMetric",
    "EpochWise",
    "Fbeta",
    "Frequency",
    "FusableMetric",
    "FusingEngine",
    "IoU",
    "Last",
    "Loss",
    "Max",
    "MeanAbsoluteError",
    "MeanSquaredError",
    "Metric",
    "MetricUsage",
    "MetricsLambda",
    "Min",
    "NotComputableError",
    "Perplexity",
    "Precision",
    "R2Score",
    "Recall",
    "RocAuc",
    "RootMeanSquaredError",
    "RunningAverage",
    "RunningBatchWise",
    "RunningEpochWise",
    "SingleEpochRunningBatchWise",
    "Std",
    "Sum",
    "TopKAccuracy",
    "TopKCategoricalAccuracy",
    "mIoU",
    "reinit__is_reduced",
    "sync_all_reduce",
]
