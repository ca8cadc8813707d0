"""Autotune: one command finds the fastest safe recipe for the user's model on this machine.

``tuneup -m experiment=autotune`` (conf/experiment/autotune.yaml) selects the Hydra sweeper
``hydra/sweeper=autotune``, which searches the features that apply here within a budget and
writes the answer into the sweep directory. The parts, in the order a search uses them:

==============  ==========================================================================
sweeper         the Hydra sweeper: runs the search through the sweep's launcher, writes
                the answer (hydra_plugins/tuneup_autotune is the class Hydra sees)
settings        the ``autotune`` config node, checked
search          the path: the recipe so far, one dimension at a time, rounds, the budget
study_search    autotune.objective=time_to_target: an Optuna study (study_space: its space;
                study_trials: a trial's figures), confirmed on paired seeds
                (study_confirm, paired: the decision), timed by paired throughput windows
                (study_speed); study_report, study_figure: autotune.json, .md and .png
race            a race trial's settings, the target a search needs, whether it was reached
space           candidates, and which may be launched (the run's own checks, no build)
batch           the batch-size dimension: memory probes, the largest batch that fits, lr
trials          a trial is an ordinary job of the sweep: launched, its summary read
interval        the interval rule (also the sweep report's): claim only outside 1.0
guard           the accuracy guard: loss curves against the baseline's
projection      GPU-hours (device-hours) and energy of the user's full run
recipe, record  conf/experiment/recipe.yaml and autotune.json
markdown,       autotune.md and autotune.png, drawn from autotune.json
figure
callback        a Hydra callback that registers the sweeper where Hydra's scan cannot
==============  ==========================================================================

docs/autotune.md is the user's page.
"""
