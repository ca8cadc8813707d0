"""``hydra.sweeper.storage`` on a real PostgreSQL server (tests/postgres.py): a study of two
workers (joblib's processes) written there, read back by Optuna; a server that does not answer.

Skipped, with the reason, only where this machine cannot start a server (PostgreSQL or its
driver not installed, root without the ``postgres`` user; .ci/run installs the package).
"""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from tests.postgres import running_server, unavailable
from tests.test_optuna import SHORT
from tests.test_sweeps import sweep
from tuneup import TuneupError

optuna = pytest.importorskip("optuna")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def postgres():
    reason = unavailable()
    if reason:
        print(f"SKIP PostgreSQL tests: {reason}")
        pytest.skip(reason)
    with running_server() as server:
        yield server


def test_a_study_of_two_workers_on_postgresql_is_read_back_by_optuna(tmp_path, postgres):
    """4 trials, 2 at a time in joblib's 2 worker processes, the study in the server: exit 0,
    and ``optuna.load_study`` on the URL reads 4 complete trials whose params are the runs'
    overrides and whose values are their summaries' val acc. Each trial's validations were
    reported from its worker's process to the server (its intermediate values)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")  # a thread per worker on 2 cores
        done, sweep_dir = sweep(
            tmp_path,
            *SHORT,
            f"hydra.sweeper.storage={postgres.url}",
            "hydra.sweeper.study_name=pg",
            "hydra.sweeper.n_trials=4",
            "hydra.sweeper.n_jobs=2",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "optimizer.lr=interval(0.01,0.3)",
            "~hydra.callbacks.sweep_report",  # report.md and its plots: not this test's
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + postgres.log()
    study = optuna.load_study(study_name="pg", storage=postgres.url)
    trials = study.get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 4
    for trial in trials:
        run_dir = sweep_dir / str(trial.number)
        summary = json.loads((run_dir / "summary.json").read_text())
        overrides = OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")
        assert f"optimizer.lr={trial.params['optimizer.lr']}" in overrides
        assert trial.values == [pytest.approx(summary["val"]["acc"])]
        assert sorted(trial.intermediate_values) == [2, 4]  # validated at steps 2 and 4
        assert trial.intermediate_values[4] == pytest.approx(summary["val"]["acc"])
    assert postgres.url in (sweep_dir / "optuna_report.md").read_text()


def test_a_server_that_does_not_answer_is_one_line_naming_the_setting():
    """No server on the port: one line that names ``hydra.sweeper.storage`` and the URL (its
    password hidden) and gives the driver's reason, not SQLAlchemy's traceback."""
    from tuneup.optuna import study as studies

    pytest.importorskip("psycopg", reason="the driver psycopg is not installed: tuneup[postgres]")
    with pytest.raises(TuneupError) as raised:
        studies.open_storage("postgresql+psycopg://x:secret@127.0.0.1:1/none")
    message = str(raised.value)  # the command prints it as `error: <message>`, exit code 1
    assert message.splitlines() == [message]
    assert message.startswith(
        "hydra.sweeper.storage=postgresql+psycopg://x:***@127.0.0.1:1/none: cannot open or "
        "write the study's database: "
    ), message
    assert "secret" not in message and "refused" in message, message
    assert "that the server answers" in message
