"""A mistyped key next to a required setting (``path: ???`` of data=textfile and data=shards):
the hint names the options that have it, and no ``+`` it does not need."""

from __future__ import annotations

import pytest

from tests.conftest import compose_config
from tuneup.trainer.hints import override_hints
from tuneup.trainer.runner import ConfigError, run


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # data.path on data=digits: not "did you mean data.path=...?", the key as typed
        (["data=digits", "data.path=in.txt"], "data.path is not a setting of data=digits (its "
         "settings are: batch_size, channels, image_size, preprocess, seed, test_fraction, "
         "val_fraction); it is one of data=shards, data=textfile"),
        (["data=digits", "data.pat=in.txt"], "did you mean data.path=in.txt (with data=shards or "
         "data=textfile)? (data=digits has no pat)"),
        # the chosen option has the key, still to be given: no + before it
        (["data=textfile", "data.pat=in.txt"], "did you mean data.path=in.txt? (data.pat is not a "
         "setting; +data.pat=in.txt would be refused: nothing reads it)"),
    ],
)  # fmt: skip
def test_a_mistyped_key_beside_a_required_one(argv, expected):
    assert override_hints(argv) == [expected]


@pytest.mark.parametrize("group", ["model", "data"])
def test_a_mistyped_target_key_is_named(tmp_path, group):
    """``model._targt_=...`` passes Hydra (any key of model=custom is an argument): the refusal
    of the missing ``_target_`` names the key that was meant as it."""
    overrides = [f"{group}=custom", f"{group}._targt_=my_nets.Net", "data.batch_size=8"]
    with pytest.raises(ConfigError) as info:
        run(compose_config(overrides), run_dir=tmp_path / "run")
    problem = str(info.value).splitlines()[-1]
    assert problem.startswith(f"  - {group}._target_ is not set")
    assert problem.endswith(
        f"did you mean {group}._target_=my_nets.Net instead of {group}._targt_=my_nets.Net?"
    )
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing was trained


def test_a_presets_target_in_mode_validate_is_refused_with_the_overrides_that_unset_it():
    """``experiment=mine mode=validate resume=...`` where the preset sets a target: the line
    names what unsets it (target.metric=null alone leaves target.value, itself refused)."""
    from tuneup.trainer.checks import mode_problems

    target = ["target.metric=val/acc", "target.value=0.5", "target.check_every_n_steps=4"]
    cfg = compose_config(["mode=validate", "resume=run/last.ckpt", *target])
    assert mode_problems(cfg) == [
        "target.metric=val/acc with mode=validate: a target is raced to while training, and this "
        "mode trains nothing; leave target.metric out (where a preset sets it: "
        "target.metric=null target.value=null)"
    ]
