"""Autotune: one command finds the fastest safe recipe for the user's model on this machine.

``tuneup -m experiment=autotune`` (conf/experiment/autotune.yaml) selects the Hydra sweeper
``hydra/sweeper=autotune``, which searches within a budget and writes the answer into the
sweep directory. The package by stage, each stage a subpackage whose ``__init__`` names its
interface; the import-linter contract in pyproject.toml keeps the layers below in this order
(a layer imports only the layers under it; ``|``: side by side, importing nothing of each
other):

======================  ===============================================================
sweeper | callback      the Hydra sweeper: reads the settings, checks the command
                        (preflight), runs the stages through the sweep's launcher, writes
                        the answer (hydra_plugins/tuneup_autotune is the class Hydra sees);
                        callback registers it where Hydra's scan cannot
pipeline | preflight |  ``autotune.stages``: the speed stage, then the study on its
time_to_target          recipe (pipeline); the command checked before anything is written
                        (preflight); ``autotune.objective=time_to_target``: the baseline,
                        the study, the confirmation, the decision (time_to_target)
report/                 the answer on disk: autotune.json, autotune.md, autotune.png, the
                        recipe preset, drawn from what the stages decided
confirm/                the study's best configurations on paired seeds, the decision, the
                        pick timed against your command (its inputs: confirm/inputs.py)
speed/ | study/         speed: the throughput walk over the machine's features, one
                        dimension at a time, in interleaved rounds; study: the Optuna study
                        of the hyperparameters, trained to the target, ``autotune.workers``
                        at once (its inputs and budget: study/inputs.py)
race                    a race trial's settings, the target a search needs, whether a trial
                        reached it
settings | space |      the ``autotune`` config node, checked; the candidates and the checks
trials | composed       that decide which may be launched; a trial: a job of the sweep,
                        launched through the Lab, its summary read; the study's checks'
                        composition of a trial on a kept composition of its config groups
======================  ===============================================================

docs/autotune.md is the user's page.
"""
