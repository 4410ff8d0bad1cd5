"""Data: in-memory datasets with seeded shuffling and a resumable position, and device prefetch."""

from ember.data._array_dataset import ArrayDataset
from ember.data._prefetch import DevicePrefetch

__all__ = ["ArrayDataset", "DevicePrefetch"]
