"""``tuneup --help``: the usage, then every config group with its choices (default marked)
from every config folder the command would read; read from disk, nothing composed and
nothing of torch imported."""

from __future__ import annotations

from pathlib import Path

from tuneup import PROJECT

USAGE = f"""\
usage: {PROJECT} [group=option ...] [key=value ...]     train once
       {PROJECT} -m group=a,b key=x,y ...                 sweep (Hydra multirun), then report.md
       {PROJECT} experiment=NAME ...                      a preset: conf/experiment/NAME.yaml
       {PROJECT} --cfg job [overrides]                    print the composed config, train nothing
       {PROJECT} plugins.list=true [overrides]            the active plugins, their hooks, what is off

  model=custom model._target_=pkg.module.Net [model.<arg>=...]   your nn.Module
  model=lightning model._target_=pkg.module.LitNet               your LightningModule
  model=huggingface model.path=DIR                               a pretrained transformers model
  data=custom data._target_=pkg.module.DataModule                your data (or Datasets)
"""


def help_text(argv: list[str]) -> str:
    """Usage, then every config group with its choices (default marked) from every config
    folder the command would read; read from disk, nothing composed or imported."""
    from omegaconf import OmegaConf

    from tuneup.trainer import config, config_folders

    dirs = list(config_folders.config_dirs(argv))
    defaults = _defaults(OmegaConf.load(dirs[0][1] / "config.yaml"))
    defaults.update(_defaults({"defaults": config.installed_defaults()}))
    lines = [USAGE, "Config groups (group=option; * is the default):"]
    for label, folder in dirs:
        found = config.groups(folder)
        if label != "built-in":
            lines.append(f"\n{label} ({folder}):")
        for group, options in found.items():
            if group.startswith("_"):
                continue
            marked = [o + ("*" if defaults.get(group) == o else "") for o in options]
            lines.append(f"  {group:<26} {', '.join(marked)}")
    lines += [
        "",
        "Any value: key=value (e.g. optimizer.lr=0.01 data.batch_size=128 trainer.max_steps=500);",
        f"the whole config: {PROJECT} --cfg job. Hydra's own flags: {PROJECT} --hydra-help.",
        *_docs_hint(),
    ]
    return "\n".join(lines)


def _defaults(root) -> dict[str, str]:
    """group -> default option, from a primary config's defaults list."""
    chosen = {}
    for item in root.get("defaults") or []:
        if not isinstance(item, str):
            for group, option in dict(item).items():
                name = group.removeprefix("optional ").split("@")[0].lstrip("/")
                chosen[name] = option if option is None else str(option)
    return chosen


def _docs_hint() -> list[str]:
    docs = Path(__file__).resolve().parent.parent / "docs"  # a checkout or an editable install
    return [f"Docs: {docs}"] if docs.is_dir() else []
