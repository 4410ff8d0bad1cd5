"""A run's evaluations: its `evaluations:` section, evaluation as a job of its own, and the checkpoint watcher.

`sections` builds each evaluation of the config (evaluator, data, noise, schedule); `job` is ``ember eval`` (a run's
model and evaluators from its ``config.yaml``, one checkpoint evaluated); `watcher` is ``ember eval --watch`` (every
committed checkpoint of a live run once, in order, its state in ``RUN_DIR/eval/NAME/watch.json``).
"""
