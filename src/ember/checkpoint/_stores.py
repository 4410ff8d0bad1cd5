"""`Store`: one of ember's checkpoint stores, as handlers take it: a `CheckpointStore` or a `TieredStore`.

An `OrbaxStore` is a `CheckpointStore` (holding the orbax format); a `TieredStore` is a composite of two stores with
the same methods. ``isinstance(x, Store)`` tells them from a user's own save handler.
"""

from ember.checkpoint._store import CheckpointStore
from ember.checkpoint._tiered import TieredStore

Store = CheckpointStore | TieredStore
