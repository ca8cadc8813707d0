"""Bad input stops the run before anything is built, naming the key and what is allowed."""

import pytest

from tuneup.trainer.runner import ConfigError, run


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["+optimizer.lrr=0.1"], "optimizer.lrr is not a setting of optimizer=sgd; its settings "
         "are: clip_grad_norm, lr, momentum, nesterov, weight_decay"),
        (["+model.widht=4"], "model.widht is not a setting of model=small_resnet; its settings "
         "are: blocks, width"),
        (["+scheduler.warmup=5"], "scheduler.warmup is not a setting of scheduler=cosine"),
        (["+data.shuffle=false"], "data.shuffle is not a setting of data=synthetic_images"),
        (["optimizer.momentum=0.0"], "optimizer.momentum=0.0 with optimizer.nesterov=true: "
         "Nesterov momentum needs momentum > 0"),
        (["trainer.max_epochs=-1"], "trainer.max_epochs=-1 and trainer.max_steps=-1: the run "
         "has no end, but scheduler=cosine needs the number of steps"),
    ],
)  # fmt: skip
def test_a_bad_key_or_value_is_named(make_config, tmp_path, overrides, expected):
    with pytest.raises(ConfigError) as info:
        run(make_config(overrides), run_dir=tmp_path)
    assert expected in str(info.value)
    assert not (tmp_path / "checkpoints").exists()  # nothing was built or trained


def test_endless_training_with_a_constant_schedule_runs(train):
    summary, _ = train("trainer.max_epochs=-1", "trainer.max_steps=3", "scheduler=constant")
    assert summary["status"] == "ok" and summary["steps"] == 3
