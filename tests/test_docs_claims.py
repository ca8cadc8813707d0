"""What the docs state about the project holds: each claim read from the page and checked
against what it describes (the composed config, the page's own listing), not as a phrase.
The commands the pages show are test_docs_commands.py's; the behaviour the pages describe is
tested where it is implemented."""

from __future__ import annotations

import re

from omegaconf import OmegaConf

from tests.conftest import ROOT, compose_config

DOCS = ROOT / "docs"
NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
#: Pages with settings tables (``| setting | default | meaning |``), each composed with the
#: overrides its settings need on top of the heading's own choice (``## WSD (`scheduler=wsd`)``).
SETTINGS_PAGES = {
    "autotune.md": ("experiment=autotune",),
    "race.md": (),
    "optimizers.md": (),
    "models_and_data.md": (),
    "precision.md": (),
    "throughput.md": (),
}
MISSING = object()


def parse(text: str):
    """A value as a command-line override would give it (``3e-3`` a float, ``null`` None)."""
    return OmegaConf.to_container(OmegaConf.create(f"value: {text}"))["value"]


def documented_defaults(text: str):
    """(heading's overrides, key, documented default) for each row of a settings table: the
    keys in the first cell's code spans (``autotune.min_rounds`, `max_rounds``: the second in
    the first's group), their defaults in the second cell's, or the whole cell for one key."""
    heading: tuple[str, ...] = ()
    in_table = False
    for line in text.splitlines():
        if line.startswith("#"):
            heading = tuple(re.findall(r"`(\w+=\w+)`", line))
        if re.match(r"^\| *\w+ *\| *default *\|", line):
            in_table = True
            continue
        in_table = in_table and line.startswith("|")
        if not in_table or line.startswith("|--"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        keys = re.findall(r"`([^`]+)`", cells[0])
        values = re.findall(r"`([^`]*)`", cells[1]) or [cells[1]]
        if "`" not in cells[1] and isinstance(parse(cells[1]), str):
            continue  # prose ("all nine"), not a value
        if not keys or "." not in keys[0] or len(keys) != len(values):
            continue  # a placeholder (`autotune.space.<dimension>`)
        group = keys[0].rsplit(".", 1)[0]
        for key, value in zip(keys, values, strict=True):
            yield heading, key if "." in key else f"{group}.{key}", value


def test_every_documented_default_is_the_configs():
    """A settings table's default is what the composed config holds: a default changed in
    conf/ and not on its page (or the reverse) fails here, naming the page and the key."""
    wrong, checked = [], 0
    for page, overrides in SETTINGS_PAGES.items():
        for heading, key, documented in documented_defaults((DOCS / page).read_text()):
            config = compose_config((*overrides, *heading), tiny=False)
            value = OmegaConf.select(config, key, default=MISSING)
            if value is MISSING or "<" in key:
                continue  # a key of a group the page's heading does not choose
            value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            checked += 1
            if parse(documented) != value:
                wrong.append(f"docs/{page}: {key} documented {documented!r}, config {value!r}")
    assert not wrong, "\n".join(wrong)
    assert checked >= 50, checked  # the tables were found and read


def test_own_model_page_counts_the_files_it_lists():
    text = (DOCS / "your_own_model.md").read_text()
    heading = re.search(r"^## A project of (\w+) files\n+```\n(.*?)```", text, re.S | re.M)
    assert heading, "docs/your_own_model.md: no '## A project of N files' listing"
    listed = [line for line in heading.group(2).splitlines()[1:] if line.strip()]
    assert NUMBERS[heading.group(1)] == len(listed), listed
