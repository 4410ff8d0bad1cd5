"""Resilience: what keeps a run alive or stops it resumably (preemption, rollback, NaN, the watchdogs)."""
