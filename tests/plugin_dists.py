"""Make real installed distributions (a module plus its ``.dist-info``) for plugin tests."""

from __future__ import annotations

import textwrap
from pathlib import Path


def make_distribution(site: Path, dist: str, modules: dict[str, str], entry_points: dict[str, str]):
    """Write ``modules`` (name -> source) and ``<dist>-1.0.dist-info`` declaring ``entry_points``
    (entry-point name -> "module:attr") in group ``tuneup`` under the directory ``site``."""
    site.mkdir(parents=True, exist_ok=True)
    for name, source in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[tuneup]\n{lines}")
    return site
