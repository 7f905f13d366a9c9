"""Experiment tracking: one MLflow or W&B run per tfctl run, the same across `--resume`, a new
allocation, a restarted task and a task moved to a spare.

The controller opens the tracker's run at the first start (`trackers.Tracker.open`), keeps it on
the run's record (`runs.record.TrackerRun`), gives every task the variables its library reads
(`task_env`), and at the end logs tfctl's own figures and the report (`close`). A tracker that
does not answer costs a line, never the run: `TrackingError` is caught by the caller, said once.
"""
