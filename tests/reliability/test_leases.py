"""Leases, take-over and log numbering in the database, on SQLite and on PostgreSQL."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import create_engine, update
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import (
    Job,
    JobStatus,
    make_engine,
    make_session_factory,
    repository,
    transaction,
    upgrade_database,
    utcnow,
)
from app.core.settings import Settings
from tests.support.helpers import postgres_schema_url
from tests.support.rows import add_job, job_row
from worker.lease import LeaseKeeper


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'leases.db'}")
        upgrade_database(engine)
        yield make_session_factory(engine)
        engine.dispose()
        return
    with postgres_schema_url() as url:
        engine = make_engine(url)
        upgrade_database(engine)
        yield make_session_factory(engine)
        engine.dispose()


def _expire(sessions: sessionmaker[Session], job_id: str) -> None:
    """What time does to the lease of a worker that stopped beating."""
    with transaction(sessions) as session:
        session.execute(update(Job).where(Job.id == job_id)
                        .values(lease_expires_at=utcnow() - dt.timedelta(seconds=1)))


def _claim(sessions: sessionmaker[Session], job_id: str, worker: str, max_attempts: int = 3) -> Job | None:
    with transaction(sessions) as session:
        return repository.claim_job(session, job_id=job_id, worker_id=worker, lease_s=60, max_attempts=max_attempts)


def test_a_live_lease_keeps_the_job_and_an_expired_one_lets_another_worker_take_it(
    sessions: sessionmaker[Session],
) -> None:
    job_id = add_job(sessions)
    first = _claim(sessions, job_id, "w1")
    assert first is not None and first.lease_expires_at is not None
    assert first.lease_expires_at > utcnow() + dt.timedelta(seconds=50)
    assert _claim(sessions, job_id, "w2") is None  # w1's lease is alive
    _expire(sessions, job_id)
    second = _claim(sessions, job_id, "w2")
    assert second is not None and (second.worker_id, second.attempts, second.progress) == ("w2", 2, 0.0)
    with transaction(sessions) as session:  # the old holder can neither beat nor write nor finish
        assert not repository.renew_lease(session, job_id=job_id, worker_id="w1", lease_s=60)
        assert not repository.report_progress(session, job_id=job_id, worker_id="w1", stage="x", progress=0.5,
                                              messages=["from the dead"]).held
        assert not repository.finish_job(session, job_id=job_id, worker_id="w1", status=JobStatus.succeeded)
        assert repository.renew_lease(session, job_id=job_id, worker_id="w2", lease_s=60)
    with sessions() as session:
        assert repository.read_logs(session, job_id=job_id, offset=0, limit=10) == []


def test_no_take_over_of_a_job_being_cancelled_or_out_of_attempts(sessions: sessionmaker[Session]) -> None:
    cancelling = add_job(sessions)
    _claim(sessions, cancelling, "w1")
    with transaction(sessions) as session:
        session.execute(update(Job).where(Job.id == cancelling).values(cancel_requested=True))
    _expire(sessions, cancelling)
    assert _claim(sessions, cancelling, "w2") is None
    spent = add_job(sessions)
    _claim(sessions, spent, "w1", max_attempts=1)
    _expire(sessions, spent)
    assert _claim(sessions, spent, "w2", max_attempts=1) is None


@pytest.mark.parametrize(("attempts", "cancel", "status", "code"), [
    (1, False, JobStatus.queued, None),
    (2, False, JobStatus.failed, "worker_lost"),
    (1, True, JobStatus.cancelled, "cancelled"),
])
def test_the_sweeper_requeues_fails_or_cancels_a_job_whose_lease_expired(
    sessions: sessionmaker[Session], attempts: int, cancel: bool, status: JobStatus, code: str | None
) -> None:
    job_id = add_job(sessions)
    for attempt in range(attempts):
        _claim(sessions, job_id, f"w{attempt}")
        _expire(sessions, job_id)
    with transaction(sessions) as session:
        session.execute(update(Job).where(Job.id == job_id).values(cancel_requested=cancel))
    with transaction(sessions) as session:
        [lost] = repository.jobs_with_expired_leases(session)
        assert repository.release_lost_job(session, job=lost, max_attempts=2) is status
    row = job_row(sessions, job_id)
    assert (row.status, row.error_code, row.worker_id, row.lease_expires_at) == (status.value, code, None, None)
    assert (row.finished_at is None) == (status is JobStatus.queued)
    with sessions() as session:
        [line] = repository.read_logs(session, job_id=job_id, offset=0, limit=10)
        assert f"w{attempts - 1}" in line.message
        assert repository.jobs_with_expired_leases(session) == []


def test_a_lease_renewed_after_the_sweeper_looked_is_not_released(sessions: sessionmaker[Session]) -> None:
    job_id = add_job(sessions)
    _claim(sessions, job_id, "w1")
    _expire(sessions, job_id)
    with transaction(sessions) as session:
        [lost] = repository.jobs_with_expired_leases(session)
    with transaction(sessions) as session:  # the worker was only slow: its heartbeat lands first
        assert repository.renew_lease(session, job_id=job_id, worker_id="w1", lease_s=60)
    with transaction(sessions) as session:
        assert repository.release_lost_job(session, job=lost, max_attempts=3) is None
    assert job_row(sessions, job_id).status == "running"


def test_the_heartbeat_renews_the_lease_and_notices_a_take_over(sessions: sessionmaker[Session]) -> None:
    job_id = add_job(sessions)
    _claim(sessions, job_id, "w1")
    with transaction(sessions) as session:
        session.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=utcnow()))
    keeper = LeaseKeeper(sessions, job_id=job_id, worker_id="w1", lease_s=30, interval_s=0.05).start()
    try:
        deadline = utcnow() + dt.timedelta(seconds=20)
        while job_row(sessions, job_id).lease_expires_at <= utcnow() + dt.timedelta(seconds=20):
            assert utcnow() < deadline, "the heartbeat did not renew the lease"
            threading.Event().wait(0.05)
        assert not keeper.lost
        with transaction(sessions) as session:  # another worker took the job over (as claim_job would)
            session.execute(update(Job).where(Job.id == job_id).values(worker_id="w2", attempts=Job.attempts + 1))
        while not keeper.lost:
            assert utcnow() < deadline + dt.timedelta(seconds=20), "the heartbeat did not notice the take-over"
            threading.Event().wait(0.05)
    finally:
        keeper.stop()


def test_a_worker_that_cannot_renew_for_a_whole_lease_stops_itself(tmp_path: Path) -> None:
    # SQLite cannot open a file in a directory that does not exist: every heartbeat fails.
    unreachable = make_session_factory(create_engine(f"sqlite:///{tmp_path / 'missing' / 'x.db'}"))
    now = [0.0]
    keeper = LeaseKeeper(unreachable, job_id="j", worker_id="w", lease_s=10, interval_s=1, clock=lambda: now[0])
    keeper.beat()  # the database does not answer, but the lease may still be alive
    assert not keeper.lost
    now[0] = 10.5
    keeper.beat()
    assert keeper.lost


def test_concurrent_log_writers_never_collide_on_line_numbers(sessions: sessionmaker[Session]) -> None:
    job_id = add_job(sessions)
    _claim(sessions, job_id, "w1")
    barrier = threading.Barrier(2)
    failures: list[BaseException] = []

    def holder() -> None:
        barrier.wait()
        for i in range(25):
            with transaction(sessions) as session:
                repository.report_progress(session, job_id=job_id, worker_id="w1", stage="recovery",
                                           progress=i / 25, messages=[f"holder {i}"])

    def sweeper_like() -> None:
        barrier.wait()
        for i in range(25):
            with transaction(sessions) as session:  # the sweeper first updates the row, then appends
                session.execute(update(Job).where(Job.id == job_id).values(updated_at=utcnow()))
                repository.append_logs(session, job_id=job_id, messages=[f"other {i}"])

    def guarded(target: object) -> None:
        try:
            target()  # type: ignore[operator]
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=guarded, args=(f,)) for f in (holder, sweeper_like)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    with sessions() as session:
        lines = repository.read_logs(session, job_id=job_id, offset=0, limit=100)
    assert [line.line for line in lines] == list(range(50))
    assert sorted(line.message for line in lines) == sorted([f"holder {i}" for i in range(25)] +
                                                            [f"other {i}" for i in range(25)])


def test_the_heartbeat_must_fit_three_times_in_the_lease(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="at most a third of CAHP_LEASE_S"):
        Settings(data_dir=tmp_path, lease_s=10, heartbeat_interval_s=4)
    assert Settings(data_dir=tmp_path).takeover_bound_s == 150
