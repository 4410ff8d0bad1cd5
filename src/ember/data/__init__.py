"""Data: in-memory and on-disk sources, Grain pipelines, device prefetch, and the resumable-iterator protocol."""

from ember._protocols import ResumableIterator
from ember.data._array_dataset import ArrayDataset
from ember.data._grain import GrainPipeline
from ember.data._masked import Masked
from ember.data._npy import NpySource
from ember.data._position import Mapped
from ember.data._prefetch import DevicePrefetch
from ember.errors import RecordError

__all__ = [
    "ArrayDataset",
    "DevicePrefetch",
    "GrainPipeline",
    "Mapped",
    "Masked",
    "NpySource",
    "RecordError",
    "ResumableIterator",
]
