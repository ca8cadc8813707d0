"""The time-to-target study's sampler (time_to_target.py opens the study with it; a sweeper
that shares the study draws from its own seed: leader.py: draw_apart)."""

from __future__ import annotations


def study_sampler(settings, seed: int, workers: int = 1):
    """The study's sampler, seeded by ``autotune.sampler_seed`` (null: the run's seed): TPE, or
    random draws from the same space (``autotune.sampler=random``: the search without a model,
    the control that shows what TPE adds under the same trials, budget and pruner). With
    several workers TPE lies about the running trials (``constant_liar``: their value taken as
    the worst so far), so that workers asking at once do not all get the same point."""
    import optuna

    seed = seed if settings.sampler_seed is None else settings.sampler_seed
    if settings.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # TPE's model starts after budget_trials / 5 random trials, at most 20 (hyperopt's
    # default): fewer let it settle before each choice (a batch size) has been seen
    return optuna.samplers.TPESampler(
        seed=seed,
        multivariate=True,
        group=True,
        n_startup_trials=max(3, min(20, settings.budget_trials // 5)),
        constant_liar=workers > 1,
    )
