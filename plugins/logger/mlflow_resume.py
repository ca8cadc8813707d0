"""``logger=mlflow`` on resume: a resumed run continues its MLflow run, without stale values.

A resumed run (``resume=``, the same run directory) continues its MLflow run, found by its
``tuneup.run_dir`` tag (:func:`earlier_run`): the metrics go on from the checkpoint's step.
What an earlier session logged after that step (a killed session's steps past its last
checkpoint) is stale: the resumed session trains those steps again, so those values are
deleted from an SQL store (MLflow's client has no call for it; its SQL store's tables are the
run's record) and each step keeps one value, the resumed session's
(:func:`drop_values_after`). A server's store cannot be reached that way: a warning names
the metrics it keeps twice past that step. Apart from :mod:`.mlflow_run` (the store, the logger, what it logs)
because it alone reaches past MLflow's client into its SQL store.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def earlier_run(uri: str, experiment: str, save_dir: str) -> str | None:
    """The MLflow run of an earlier session of this run directory (a resumed run), or None."""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return None  # a new run directory's own store: nothing earlier (and no store to make)
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    where = str(Path(save_dir).resolve())
    # the filter's string cannot hold a quote: then the newest runs are read and matched here
    query = "" if "'" in where else f"tags.`tuneup.run_dir` = '{where}'"
    runs = [
        r
        for r in client.search_runs(
            [found.experiment_id], query, max_results=1000, order_by=["attributes.start_time DESC"]
        )
        if r.data.tags.get("tuneup.run_dir") == where
    ][:1]
    if not runs:
        return None
    client.update_run(runs[0].info.run_id, status="RUNNING")
    return runs[0].info.run_id


def drop_values_after(logger, step: int, uri: str) -> None:
    """Delete the run's metric values past ``step`` (the checkpoint a resumed session starts
    from): an earlier session's, which this one trains again. Each (key, step) then keeps one
    value, the one this session logs. Possible in an SQL store only (the default SQLite file, a
    database); a server's store keeps them, and a warning says so."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    client, run_id = logger.experiment, logger.run_id
    store = client._tracking_client.store  # the client's own (MLflow has no public handle)
    if isinstance(store, SqlAlchemyStore):
        _delete_after(store, run_id, step)
        return
    stale = [
        key
        for key in client.get_run(run_id).data.metrics
        if max((m.step for m in client.get_metric_history(run_id, key)), default=-1) > step
    ]
    if stale:
        log.warning(
            "logger=mlflow: %s keeps an earlier session's values of %s past step %d, where this "
            "session goes on: MLflow's client cannot delete them (an SQL store's are deleted), "
            "so those steps have two values each",
            uri,
            ", ".join(sorted(stale)),
            step,
        )


def _delete_after(store, run_id: str, step: int) -> int:
    """Delete the values past ``step`` from the SQL store's metrics table, and set each
    affected key's latest value (the table MLflow's search and run view read) to the newest
    that is left. Returns how many values went."""
    from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric

    try:
        managed = store.ManagedSessionMaker(read_only=False)
    except TypeError:  # an MLflow before read-only sessions (3.0...): all sessions write
        managed = store.ManagedSessionMaker()
    with managed as session:
        stale = session.query(SqlMetric).filter(SqlMetric.run_uuid == run_id, SqlMetric.step > step)
        keys = sorted({key for (key,) in stale.with_entities(SqlMetric.key).distinct()})
        if not keys:
            return 0
        deleted = stale.delete(synchronize_session=False)
        session.query(SqlLatestMetric).filter(
            SqlLatestMetric.run_uuid == run_id, SqlLatestMetric.key.in_(keys)
        ).delete(synchronize_session=False)
        for key in keys:
            newest = (
                session.query(SqlMetric)
                .filter(SqlMetric.run_uuid == run_id, SqlMetric.key == key)
                .order_by(SqlMetric.step.desc(), SqlMetric.timestamp.desc(), SqlMetric.value.desc())
                .first()
            )
            if newest is not None:
                session.add(
                    SqlLatestMetric(
                        run_uuid=run_id,
                        key=key,
                        value=newest.value,
                        timestamp=newest.timestamp,
                        step=newest.step,
                        is_nan=newest.is_nan,
                    )
                )
    return deleted
