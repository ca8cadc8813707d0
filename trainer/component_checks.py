"""Whether what a run trains is sound: its model, its data and its task, each on its own (the
zoo's rules, or whether the user's target imports and its data can be read), then whether the
model reads the data (pairing.py).

:attr:`Plan.problems <tuneup.trainer.components.Plan.problems>` asks here once; the run's
checks and the plugins read the answer from the plan. With components.py, the one part of the
core that reaches the zoo (its models' and data sets' own checks).
"""

from __future__ import annotations

from tuneup.errors import TuneupError
from tuneup.trainer import task as tasks
from tuneup.trainer.pairing import pairing_problems


def component_problems(plan) -> list[str]:
    """Problems with ``model``, ``data`` and ``task``, then whether the model can read the data
    (``plan``: the run's :class:`~tuneup.trainer.components.Plan`).

    Each side is checked on its own first (the zoo's rules, or whether the user's target
    imports and its data can be read); only when both are sound is the pairing checked.
    """
    from tuneup.trainer.validation import Integer, OneOf, problems
    from tuneup.zoo.data import check_data
    from tuneup.zoo.models import check_model

    cfg = plan.cfg
    found = problems(cfg, {"task": OneOf(tasks.CHOICES)})
    model_side = _user_problems(lambda: plan.model_target) if plan.user_model else check_model(cfg)
    data_side = _user_problems(lambda: plan.sample) if plan.user_data else check_data(cfg)
    found += model_side + data_side
    if plan.user_data and not data_side:
        found += problems(
            cfg,
            {"data.batch_size": Integer(low=1, also=(None,), note="null: the data module's own")},
        )
        if plan.data.source is None and plan.data.batch_size is None:
            found.append(
                f"data.batch_size is not set: data._target_={plan.data_name} returns "
                "Datasets, so tuneup makes the DataLoaders; give the batch size per "
                "process, e.g. data.batch_size=64"
            )
    if found:
        return found
    if not plan.user_model:  # a zoo model: its inputs against the data's first
        from tuneup.zoo.models import MODELS

        found = _zoo_input_problems(plan)
        if found or not (plan.user_data or MODELS[cfg.model.name].own_config):
            return found
    return pairing_problems(plan)


def _user_problems(touch) -> list[str]:
    """The error of reaching a user's target (importing it, reading its data), as a problem."""
    try:
        touch()
    except TuneupError as exc:
        return [str(exc)]
    return []


def _zoo_input_problems(plan) -> list[str]:
    """A zoo model that cannot read the data: GPT on images, a ResNet on tokens, no classes."""
    from tuneup.zoo.data import DATA
    from tuneup.zoo.models import MODELS

    spec, given = MODELS[plan.cfg.model.name], plan.inputs
    wanted = spec.inputs
    if (
        plan.user_data
        and not spec.own_config
        and (plan.num_classes is None or plan.input_shape is None)
    ):
        return [plan._zoo_needs()]
    if given is None or given == wanted:
        return []
    fitting = sorted(n for n, d in DATA.items() if d.inputs == wanted)
    return [
        f"model={plan.model_name} reads {wanted} but data={plan.data_name} gives {given}; "
        f"use data={' or data='.join(fitting)}, or a model for {given}"
    ]
