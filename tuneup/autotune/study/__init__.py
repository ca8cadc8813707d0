"""The study stage of ``autotune.objective=time_to_target``: an Optuna study of the training
hyperparameters, each trial trained to the target, up to ``autotune.workers`` at once."""
