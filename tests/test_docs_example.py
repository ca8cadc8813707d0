"""The worked example in docs/plugins.md runs as written, installed as a real distribution."""

import json
import re
import tomllib

from tests.conftest import ROOT
from tests.plugin_dists import make_distribution


def _block(doc: str, marker: str) -> str:
    match = re.search(rf"<!-- example:{marker} -->\n```\w+\n(.*?)```", doc, re.DOTALL)
    assert match, f"docs/plugins.md has no example:{marker} block"
    return match.group(1)


def test_worked_example_from_the_docs(cli, tmp_path):
    doc = (ROOT / "docs" / "plugins.md").read_text()
    project = tomllib.loads(_block(doc, "pyproject"))["project"]
    entry_points = project["entry-points"]["tuneup"]
    module = entry_points["gradnorm"].split(":")[0]
    site = make_distribution(tmp_path / "site", project["name"], {module: _block(doc, "module")},
                             entry_points)  # fmt: skip
    result = cli("trainer.max_epochs=2", env={"PYTHONPATH": str(site)})
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["plugins"]["gradnorm"] == {"reports": "grad_norm_max"}
    assert summary["grad_norm_max"] > 0
