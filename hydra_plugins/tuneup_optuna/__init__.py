"""tuneup's Optuna sweeper (``hydra/sweeper=optuna``, set by ``hparams_search=optuna``): Hydra
instantiates sweepers only from the ``hydra_plugins`` namespace package; the search itself is
tuneup.optuna. Its config is conf/hydra/sweeper/optuna.yaml (with sampler/ and pruner/)."""
