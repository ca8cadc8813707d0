"""What a typo most likely meant: :func:`did_you_mean` ranks the names close to it, and
:func:`suggest_key` and :func:`suggest_root` find the key of a composed config meant by one
it lacks (``modle.hidden``: ``model.hidden``), the options of its group read from the config
folders.

The command's one-line refusals (hints.py) and the run's checks (checks.py, unread_keys.py,
the resume's settings, a ``_target_``) name what was meant with these. Nothing here imports
torch.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from tuneup.trainer import config


def has(cfg, key: str) -> bool:
    """Whether ``cfg`` has the dotted ``key``, a mandatory value not yet given (``???``, as
    ``model._target_`` of ``model=custom``) too: OmegaConf's select and ``in`` take that for
    absent, its ``keys()`` do not."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node.keys()  # noqa: SIM118 (??? too)


def did_you_mean(
    name: str, candidates: Iterable, prefer: Callable[[str], bool] | None = None
) -> str | None:
    """The candidate ``name`` is most likely a typo of, or None.

    Close candidates are difflib's (ratio >= 0.75) and those ``name`` begins
    (``skip_norm``: ``skip_norms_biases``). Of these, first those ``prefer`` accepts (for
    ``modle.hidden``: the nodes that have a ``hidden``), then the fewest edits (a swap of
    neighbours is one: ``fp61``, ``fp16``), then one at least as long as ``name``: a typo drops
    or swaps letters more often than it adds one (``modle``: ``model`` before ``mode``).
    Further ties: difflib's order (its highest ratio first).
    """
    options = sorted({str(c) for c in candidates})
    close = difflib.get_close_matches(name, options, n=max(len(options), 1), cutoff=0.75)
    close += [c for c in options if len(name) >= 3 and c.startswith(name) and c not in close]
    if not close:
        return None

    def rank(candidate: str) -> tuple:
        preferred = prefer is None or prefer(candidate)
        return not preferred, _edits(name, candidate), len(candidate) < len(name)

    return min(close, key=rank)


def _edits(a: str, b: str) -> int:
    """Edits from ``a`` to ``b``: a letter inserted, deleted, changed, or two neighbours
    swapped (the optimal string alignment distance)."""
    before, previous = None, list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], before[j - 2] + 1)
        before, previous = previous, row
    return previous[-1]


def suggest_key(cfg, key: str, extra: dict[str, set[str]] | None = None) -> str | None:
    """The existing dotted key of ``cfg`` that ``key`` is most likely a typo of, or None.
    ``extra``: more names allowed under a parent (``trainer``: Lightning's arguments)."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    candidates = set(node.keys()) if hasattr(node, "keys") else set()
    candidates |= (extra or {}).get(parent, set())
    match = did_you_mean(leaf, candidates)
    return None if match is None else (f"{parent}.{match}" if parent else match)


def options_with(group: str, key: str, folders: Iterable[Path]) -> list[str]:
    """The options of ``group`` whose files set ``key``'s first part (``hidden``: ``mlp``), a
    mandatory ``???`` too (``path``: ``textfile``), which OmegaConf's ``in`` takes for absent."""
    head, found = key.split(".")[0], set()
    for folder in folders:
        for path in (Path(folder) / group).glob("*.yaml"):
            loaded = OmegaConf.load(path)
            node = loaded.get(group) if config._is_global(path) else loaded
            if OmegaConf.is_dict(node) and head in node.keys():  # noqa: SIM118 (??? too)
                found.add(path.stem)
    return sorted(found)


def suggest_root(cfg, key: str, folders: list[Path]) -> str | None:
    """For a key whose first part is no group and no top-level key (``modle.hidden``), the
    key meant (``model.hidden``): the first part matched against the groups and the
    top-level keys, those that are nodes when the key goes on, those that have the rest
    (in the config or in one of their group's options) first."""
    root, _, rest = key.partition(".")
    groups = {g.split("/")[0] for folder in folders for g in config.groups(folder)}
    if rest:
        names = {k for k in cfg if isinstance(cfg.get(k), DictConfig)} | groups
    else:
        names = set(cfg) | groups

    def has_rest(name: str) -> bool:
        if has(cfg, f"{name}.{rest}"):
            return True
        return name in groups and bool(options_with(name, rest, folders))

    match = did_you_mean(root, names - {config.HYDRA_GROUP}, prefer=has_rest if rest else None)
    return None if match is None else ".".join(filter(None, (match, rest)))
