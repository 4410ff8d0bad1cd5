"""Where a run's numbers go (console, TensorBoard, JSONL, CSV, W&B, MLflow, CLU), written on a background thread."""

from ember.writers._async import AsyncWriter, is_primary_process
from ember.writers._clu import CluWriter, MetricWriterAdapter, as_clu_writer
from ember.writers._console import ConsoleWriter
from ember.writers._figures import confusion_matrix_image
from ember.writers._files import CsvWriter, JsonlWriter
from ember.writers._histogram import Histogram, histogram, tensorboard_edges
from ember.writers._mlflow import MlflowWriter
from ember.writers._multi import MultiWriter
from ember.writers._run import WRITERS, create_run_writer
from ember.writers._tensorboard import TensorBoardWriter
from ember.writers._wandb import WandbWriter
from ember.writers._writer import Writer

__all__ = [
    "WRITERS",
    "AsyncWriter",
    "CluWriter",
    "ConsoleWriter",
    "CsvWriter",
    "Histogram",
    "JsonlWriter",
    "MetricWriterAdapter",
    "MlflowWriter",
    "MultiWriter",
    "TensorBoardWriter",
    "WandbWriter",
    "Writer",
    "as_clu_writer",
    "confusion_matrix_image",
    "create_run_writer",
    "histogram",
    "is_primary_process",
    "tensorboard_edges",
]
