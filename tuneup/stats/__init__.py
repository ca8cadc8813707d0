"""The statistics the sweep report and the autotune decide by: Student's t intervals
(interval.py), paired decisions over seeds (paired.py), the sequential test that stops
adding seeds (sequential.py) and the ratio of two times to target (time_ratio.py).

A leaf of the package: plain Python (math, statistics), importing nothing of tuneup, so
the report, the autotune and the Optuna sweeper share one rule without importing each
other (the import-linter contracts in pyproject.toml keep it so).
"""
