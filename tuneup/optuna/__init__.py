"""tuneup's Optuna sweeper, on Optuna's ask-and-tell API (``hparams_search=optuna``, docs/sweeps.md).

- space.py: Hydra's sweep syntax (choice, range, interval, tag(log, ...)) as distributions;
- study.py: the storage, the study, continuing a killed sweep, a job's own trial;
- liveness.py: whether a sweeper is alive, on this host or another (its heartbeat in the study);
- resume.py: a continued study's sampler seed, and the killed trial's run directory;
- objectives.py: the objectives, checked before any trial and read from each summary.json;
- settings.py: the sweeper's node (objectives, directions, n_trials...), checked;
- sweeper.py: ask, launch through the user's launcher, tell from each run's summary.json;
- report.py: optuna_report.md, pareto.png and optimization_results.yaml in the sweep directory.

A run reports to its trial through the plugin plugins/optuna_trial.py.
"""
