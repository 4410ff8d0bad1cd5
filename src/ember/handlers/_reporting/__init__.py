"""Reporting: what tells how a run goes (loggers, progress, LR and model statistics, throughput, goodput)."""
