"""bench/race.py's tasks, and the search's settings frozen in a dated file before the race.

Every task is real data that ships with every install (nothing downloaded) and a command
whose default reaches the target in about a minute or less on 2 CPU cores. The targets were
chosen before any search ran on the task, from the default alone (``python bench/race.py
--choose-targets``: the default's command on seed 0 at its full length, no autotune): an
accuracy target is the default's best x 0.99, a loss target its best x 1.02, each rounded
to two decimals away from the best. digits and python_source keep the targets of the race
the search's settings were first tuned on; the other tasks were never searched when those
settings were frozen: a conv net, another data set, another text, and held-out variants
of the first two in depth and width, as AlgoPerf's held-out workloads vary its workloads.

``step_hint`` (AlgoPerf's name): the length of AlgoPerf's schedule for its baseline, set so
that the target falls near its end as AlgoPerf's workload targets do: 1.25 x the default's
steps to the target on seed 0 (the target then falls at 80 % of it).
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The search's settings for the race, frozen before it ran; FROZEN_SHA256 is its hash then.
FROZEN = Path(__file__).with_name("race_frozen_2026-11-29.yaml")
FROZEN_SHA256 = "c8b7897c06da579cf48d856595324db32fee5280b0daeaf16c4363ab1729e0d1"
#: In a command, the file bench/race_data.write_reference_text writes (in the race's folder).
TEXT = "{reference_text}"
#: In a command, the file bench/race_data.write_unicode_names writes (in the race's folder).
NAMES = "{unicode_names}"
#: Search contenders and the settings each adds to the frozen ones (the file may add more).
SEARCHES = ("random", "autotune", "autotune_steps")

_GPT = [
    "model=gpt",
    "model.layers=2",
    "model.width=64",
    "data.context=64",
    "data.val_samples=64",
    "data.batch_size=32",
    "optimizer=adamw",
    "trainer.max_steps=300",
    "trainer.max_epochs=-1",
    "target.metric=val/loss",
    "target.check_every_n_steps=10",
]
_DIGITS = [
    "data=digits",
    "model=mlp",
    "model.hidden=[64]",
    "data.image_size=8",
    "data.channels=1",
    "trainer.max_epochs=30",
    "target.metric=val/acc",
    "target.check_every_n_steps=5",
]

TASKS = {
    "digits": {  # the MLP on scikit-learn's digits (issue 42's race)
        "command": [*_DIGITS, "target.value=0.95"],
        "step_hint": 660,  # 30 epochs x 22 steps: the run's length (issue 42's choice, kept)
    },
    "python_source": {  # a byte-level GPT on the standard library's .py files (issue 42's race)
        "command": ["data=python_source", "data.max_bytes=300000", *_GPT, "target.value=3.1"],
        "step_hint": 300,  # trainer.max_steps (issue 42's choice, kept)
    },
    "digits_deep": {  # held out: digits' MLP two layers deep and half as wide
        "command": [*_DIGITS, "model.hidden=[32,32]", "target.value=0.95"],
        "step_hint": 157,  # the default: best 0.9639 at step 355, 0.95 at step 125
    },
    "python_source_deep": {  # held out: the GPT three blocks deep and 48 wide
        "command": ["data=python_source", "data.max_bytes=300000", *_GPT, "model.layers=3",
                    "model.width=48", "target.value=2.43"],
        "step_hint": 263,  # the default: best 2.3770 at step 300, 2.43 at step 210
    },
    "digits_conv": {  # a conv net with BatchNorm on the digits' 8x8 grey images
        "command": ["data=digits", "data.image_size=8", "data.channels=1", "model=small_resnet",
                    "model.width=8", "model.blocks=[1,1]", "trainer.max_epochs=6",
                    "target.metric=val/acc", "target.check_every_n_steps=5",
                    "target.value=0.97"],
        "step_hint": 107,  # the default: best 0.9806 at step 85, 0.97 at step 85
    },
    "breast_cancer": {  # another data set: scikit-learn's breast-cancer table, an MLP, the
        # user's learning rate a tenth of SGD's default (at 0.05 the default reaches any
        # target by its second validation: nothing left to race)
        "command": ["data=custom", "data._target_=bench.race_data.breast_cancer",
                    "data.batch_size=32", "model=mlp", "model.hidden=[32]", "optimizer.lr=0.005",
                    "trainer.max_epochs=10", "target.metric=val/acc",
                    "target.check_every_n_steps=2", "target.value=0.95"],
        "step_hint": 45,  # the default: best 0.9649 at step 42, 0.95 at step 36
    },
    "python_reference": {  # another text: the language reference's prose (pydoc_data), a GPT
        "command": ["data=textfile", f"data.path={TEXT}", *_GPT, "target.value=2.71"],
        "step_hint": 200,  # the default: best 2.6538 at step 250, 2.71 at step 160
    },
    # held out after the race of the seven above: chosen, and their targets set from the
    # default alone, before any search ran on them
    "wine": {  # another data set: scikit-learn's wine table (3 classes), the breast-cancer
        # task's MLP and learning rate
        "command": ["data=custom", "data._target_=bench.race_data.wine", "data.batch_size=32",
                    "model=mlp", "model.hidden=[32]", "optimizer.lr=0.005",
                    "trainer.max_epochs=30", "target.metric=val/acc",
                    "target.check_every_n_steps=2", "target.value=0.96"],
        "step_hint": 138,  # the default: best 0.9722 at step 110, 0.96 at step 110
    },
    "digits_conv_wide": {  # held out: the conv net twice as wide and three stages deep
        "command": ["data=digits", "data.image_size=8", "data.channels=1", "model=small_resnet",
                    "model.width=16", "model.blocks=[1,1,1]", "trainer.max_epochs=6",
                    "target.metric=val/acc", "target.check_every_n_steps=5",
                    "target.value=0.98"],
        "step_hint": 75,  # the default: best 0.9917 at step 90, 0.98 at step 60
    },
    "unicode_names": {  # another text: the Unicode character names (unicodedata), a GPT
        "command": ["data=textfile", f"data.path={NAMES}", *_GPT, "target.value=2.65"],
        "step_hint": 213,  # the default: best 2.5922 at step 300, 2.65 at step 170
    },
}  # fmt: skip

#: --smoke: two quick tasks.
SMOKE_TASKS = ("digits", "breast_cancer")


def command(name: str, folder: Path) -> list[str]:
    """The task's command, its corpus written into ``folder`` where it reads one."""
    import race_data

    found = list(TASKS[name]["command"])
    for mark, write in (
        (TEXT, race_data.write_reference_text),
        (NAMES, race_data.write_unicode_names),
    ):
        if any(mark in arg for arg in found):
            path = str(write(folder))
            found = [arg.replace(mark, path) for arg in found]
    return found


def target_value(name: str) -> float:
    return float(next(a for a in TASKS[name]["command"] if a.startswith("target.value="))[13:])


# -- the frozen settings --------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_frozen(path: Path = FROZEN, unfrozen: bool = False, changes: tuple[str, ...] = ()) -> dict:
    """The search's settings from the frozen file, with ``changes`` (KEY=VALUE, autotune keys)
    on top. A file whose hash is not the frozen one, or any change, is refused unless
    ``unfrozen``: the searches must run with the settings fixed before they ran."""
    import yaml
    from omegaconf import OmegaConf

    found = sha256(path)
    if found != FROZEN_SHA256 and not unfrozen:
        raise SystemExit(
            f"error: {Path(path).name} has sha256 {found[:12]}, not the frozen "
            f"{FROZEN_SHA256[:12]} (bench/race_tasks.py FROZEN_SHA256): the search's settings "
            "changed after they were frozen; freeze a new dated file, or pass --unfrozen"
        )
    if changes and not unfrozen:
        raise SystemExit(
            f"error: --set {' '.join(changes)} changes the frozen search settings of "
            f"{Path(path).name}; pass --unfrozen to run with them (the output says so)"
        )
    values = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    settings = dict(values["autotune"])
    for change in changes:
        key, _, value = change.partition("=")
        settings[key.removeprefix("autotune.")] = yaml.safe_load(value)  # 7 -> 7, tpe -> "tpe"
    return {
        "file": Path(path).name,
        "sha256": found,
        "frozen": found == FROZEN_SHA256 and not changes,
        "settings": settings,
        "sampler_seeds": list(values["sampler_seeds"]),
        "contenders": {k: dict(v or {}) for k, v in values["contenders"].items()},
    }


def search_overrides(frozen: dict, contender: str, sampler_seed: int) -> list[str]:
    """The overrides of one search: the frozen settings, the contender's own, the seed."""
    settings = {**frozen["settings"], **frozen["contenders"][contender]}
    found = [f"autotune.{key}={_value(value)}" for key, value in settings.items()]
    return ["experiment=autotune", *found, f"autotune.sampler_seed={sampler_seed}"]


def _value(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


def problems(names, folder: Path, frozen: dict | None, runs=()) -> list[str]:
    """Each task's command as tuneup's checks see it before anything trains (and, for each
    search contender in ``runs``, the frozen settings as the autotune reads them)."""
    import tuneup
    from tuneup.autotune.settings import Settings
    from tuneup.autotune.space import Checks

    found = []
    for name in names:
        inspection = Checks(tuneup.compose).inspect(tuple(command(name, folder)))
        found += [f"{name}: {p}" for p in inspection.problems]
    for contender in [r for r in runs if r in SEARCHES and frozen]:  # the same for every task
        try:
            overrides = search_overrides(frozen, contender, 0)
            Settings.from_config(tuneup.compose([*overrides, *command(names[0], folder)]))
        except Exception as exc:  # Hydra's composition errors and the settings' own
            first = str(exc).strip().splitlines()[0]
            found.append(f"the {contender} search's settings ({frozen['file']}): {first}")
    return found


def shown(args: list[str]) -> str:
    return shlex.join(args)
