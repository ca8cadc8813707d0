"""The console says what is true and no more: a crash is one line naming where it happened and
the log file that holds the traceback; start-up, Lightning's tips, leftovers (issue 25)."""

from __future__ import annotations

import textwrap

BOOM = """
    import torch


    class Net(torch.nn.Module):
        def __init__(self, width: int = 8, steps_before_failing: int = 3):
            super().__init__()
            self.linear = torch.nn.Linear(3 * 32 * 32, 10)
            self.left = steps_before_failing

        def forward(self, x):
            if self.training:
                self.left -= 1
                if self.left < 0:
                    return self.linear(x)  # not flattened: torch raises a shape error
            return self.linear(x.flatten(1))
"""


def test_an_exception_in_training_is_one_line_naming_where_and_the_log_file(cli, tmp_path):
    (tmp_path / "boom_model.py").write_text(textwrap.dedent(BOOM))
    args = ("model=custom", "model._target_=boom_model.Net")
    result = cli(*args, cwd=tmp_path)
    assert result.returncode == 1
    log = tmp_path / "run" / "tuneup.log"
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: RuntimeError: mat1 and mat2 shapes cannot be multiplied")
    assert "raised in torch.nn.modules.linear" in line
    assert "called from boom_model (line 15, in forward) at step 3" in line
    assert f"the traceback is in {log}" in line
    assert "Traceback" not in result.stderr + result.stdout
    assert "Traceback" in log.read_text() and "return self.linear(x)" in log.read_text()

    loud = cli(*args, "resume=null", cwd=tmp_path, run_dir=tmp_path / "loud",
               env={"HYDRA_FULL_ERROR": "1"})  # fmt: skip
    assert loud.returncode == 1 and "Traceback" in loud.stderr
