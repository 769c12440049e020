"""The persistence layer, the same tests on SQLite and on the PostgreSQL server at 127.0.0.1:5432."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import Base, Job, JobLog, JobStatus, Upload, repository, transaction, upgrade_database
from app.core.db.repository import ArtifactRecord
from tests.support.rows import add_job, add_owner


def test_migrations_match_the_models(db: Engine) -> None:
    with db.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection, opts={"compare_type": True}), Base.metadata)
    assert diff == []
    names = set(inspect(db).get_table_names())
    assert {"jobs", "job_logs", "artifacts", "uploads", "api_keys", "alembic_version"} <= names


def test_upgrade_is_idempotent_and_downgrade_removes_everything(db: Engine) -> None:
    upgrade_database(db)  # a second upgrade at head changes nothing
    from alembic import command
    from alembic.config import Config

    from app.core.db import migrations_dir

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    with db.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "base")
    assert set(inspect(db).get_table_names()) <= {"alembic_version"}


def test_a_job_round_trips_with_aware_utc_times(sessions: sessionmaker[Session]) -> None:
    owner = add_owner(sessions)
    job_id = add_job(sessions, owner)
    with sessions() as session:
        job = repository.get_job(session, job_id=job_id, owner_id=owner)
        assert job is not None
        assert job.status == "queued" and job.progress == 0.0 and job.attempts == 0
        assert job.created_at.tzinfo is not None and job.created_at.utcoffset() == dt.timedelta(0)
        assert job.dataset == {"uri": "hf://datasets/org/data"} and job.params == {"epochs": 1}
        assert repository.get_job(session, job_id=job_id, owner_id=add_owner(sessions, "other")) is None


def test_idempotency_key_is_unique_per_owner(sessions: sessionmaker[Session]) -> None:
    alice, bob = add_owner(sessions, "alice"), add_owner(sessions, "bob")
    first = add_job(sessions, alice, key="k-1")
    add_job(sessions, bob, key="k-1")  # another owner may reuse the key
    add_job(sessions, alice)  # jobs without a key never collide
    add_job(sessions, alice)
    with pytest.raises(IntegrityError):
        add_job(sessions, alice, key="k-1")
    with sessions() as session:
        found = repository.find_job_by_idempotency_key(session, owner_id=alice, key="k-1")
        assert found is not None and found.id == first


def test_listing_is_newest_first_with_a_stable_cursor(sessions: sessionmaker[Session]) -> None:
    owner = add_owner(sessions)
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    # Two jobs share a timestamp: the id breaks the tie, so no job is skipped or repeated.
    ids = [add_job(sessions, owner, when=base + dt.timedelta(seconds=i // 2), job_id=f"{i:032x}") for i in range(5)]
    add_job(sessions, add_owner(sessions, "other"))
    seen: list[str] = []
    before = None
    with sessions() as session:
        while True:
            page = repository.list_jobs(session, owner_id=owner, limit=2, before=before)
            if not page:
                break
            seen.extend(job.id for job in page)
            before = (page[-1].created_at, page[-1].id)
    assert seen == list(reversed(ids))


def test_claim_succeeds_once_and_only_from_queued(sessions: sessionmaker[Session]) -> None:
    job_id = add_job(sessions, add_owner(sessions))
    with transaction(sessions) as session:
        claimed = repository.claim_job(session, job_id=job_id, worker_id="w1")
        assert claimed is not None and claimed.status == "running" and claimed.attempts == 1
        assert claimed.worker_id == "w1" and claimed.started_at is not None
    with transaction(sessions) as session:
        assert repository.claim_job(session, job_id=job_id, worker_id="w2") is None
        assert repository.claim_job(session, job_id="missing", worker_id="w2") is None


def test_concurrent_claims_have_exactly_one_winner(sessions: sessionmaker[Session]) -> None:
    job_id = add_job(sessions, add_owner(sessions))
    winners: list[str] = []
    barrier = threading.Barrier(4)

    def claim(worker: str) -> None:
        barrier.wait()
        with transaction(sessions) as session:
            if repository.claim_job(session, job_id=job_id, worker_id=worker) is not None:
                winners.append(worker)

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1
    with sessions() as session:
        job = repository.get_job(session, job_id=job_id)
        assert job is not None and job.worker_id == winners[0] and job.attempts == 1


def test_progress_is_written_only_by_the_holder(sessions: sessionmaker[Session]) -> None:
    job_id = add_job(sessions, add_owner(sessions))
    with transaction(sessions) as session:
        repository.claim_job(session, job_id=job_id, worker_id="w1")
    with transaction(sessions) as session:
        ack = repository.report_progress(session, job_id=job_id, worker_id="w1", stage="signatures", progress=0.3)
        assert ack == repository.ProgressAck(held=True, cancel_requested=False)
        other = repository.report_progress(session, job_id=job_id, worker_id="w2", stage="sweep", progress=0.9)
        assert other.held is False
    with sessions() as session:
        job = repository.get_job(session, job_id=job_id)
        assert job is not None and (job.stage, job.progress) == ("signatures", 0.3)


def test_cancel_finishes_a_queued_job_and_flags_a_running_one(sessions: sessionmaker[Session]) -> None:
    owner = add_owner(sessions)
    queued, running = add_job(sessions, owner), add_job(sessions, owner)
    with transaction(sessions) as session:
        repository.claim_job(session, job_id=running, worker_id="w1")
    with transaction(sessions) as session:
        repository.request_cancel(session, job_id=queued, owner_id=owner)
        repository.request_cancel(session, job_id=running, owner_id=owner)
    with transaction(sessions) as session:
        q = repository.get_job(session, job_id=queued)
        r = repository.get_job(session, job_id=running)
        assert q is not None and q.status == "cancelled" and q.finished_at is not None
        assert r is not None and r.status == "running" and r.cancel_requested
        # A queued job cancelled before a worker saw it cannot be claimed any more.
        assert repository.claim_job(session, job_id=queued, worker_id="w2") is None
        assert repository.job_control(session, job_id=running, worker_id="w1") == repository.ProgressAck(
            held=True, cancel_requested=True)


def test_finish_records_artifacts_atomically_and_only_for_the_holder(sessions: sessionmaker[Session]) -> None:
    job_id = add_job(sessions, add_owner(sessions))
    with transaction(sessions) as session:
        repository.claim_job(session, job_id=job_id, worker_id="w1")
    records = [ArtifactRecord(name=n, size=3, sha256="a" * 64, media_type="application/json",
                              storage_key=f"jobs/{job_id}/1/{n}") for n in ("report.json", "head_map.json")]
    with transaction(sessions) as session:
        assert not repository.finish_job(session, job_id=job_id, worker_id="w2", status=JobStatus.succeeded,
                                         artifacts=records)
    with sessions() as session:
        assert repository.list_artifacts(session, job_id=job_id) == []
    with transaction(sessions) as session:
        assert repository.finish_job(session, job_id=job_id, worker_id="w1", status=JobStatus.succeeded,
                                     result={"k_star": 2}, artifacts=records)
    with sessions() as session:
        job = repository.get_job(session, job_id=job_id)
        assert job is not None and job.status == "succeeded" and job.progress == 1.0 and job.result == {"k_star": 2}
        assert [a.name for a in repository.list_artifacts(session, job_id=job_id)] == ["head_map.json", "report.json"]
        assert repository.get_artifact(session, job_id=job_id, name="report.json") is not None
    with transaction(sessions) as session:  # a finished job cannot be finished again
        assert not repository.finish_job(session, job_id=job_id, worker_id="w1", status=JobStatus.failed)


def test_logs_append_in_order_and_page_by_offset(sessions: sessionmaker[Session]) -> None:
    job_id = add_job(sessions, add_owner(sessions))
    with transaction(sessions) as session:
        assert repository.next_log_line(session, job_id=job_id) == 0
        after = repository.append_logs(session, job_id=job_id, messages=["a", "b", "c"])
        assert after == 3
    with transaction(sessions) as session:  # a later writer continues the numbering
        assert repository.append_logs(session, job_id=job_id, messages=["d"]) == 4
    with sessions() as session:
        assert repository.next_log_line(session, job_id=job_id) == 4
        assert [r.message for r in repository.read_logs(session, job_id=job_id, offset=1, limit=2)] == ["b", "c"]
        assert [r.line for r in repository.read_logs(session, job_id=job_id, offset=3, limit=10)] == [3]
        assert repository.read_logs(session, job_id=job_id, offset=4, limit=10) == []
    with pytest.raises(IntegrityError), transaction(sessions) as session:  # line numbers are unique
        session.add(JobLog(job_id=job_id, line=2, message="clash"))
        session.flush()


def test_uploads_are_visible_only_to_their_owner_once_complete(sessions: sessionmaker[Session]) -> None:
    alice, bob = add_owner(sessions, "alice"), add_owner(sessions, "bob")
    with transaction(sessions) as session:
        repository.add_upload(session, Upload(id="f" * 32, owner_id=alice, kind="data", filename="train.csv",
                                              suffix=".csv", media_type="text/csv", size=10, sha256="b" * 64,
                                              storage_key="uploads/x.csv"))
    with sessions() as session:  # recorded, but its object is not stored yet
        assert repository.get_upload(session, upload_id="f" * 32, owner_id=alice) is None
    with transaction(sessions) as session:
        repository.complete_upload(session, upload_id="f" * 32)
    with sessions() as session:
        assert repository.get_upload(session, upload_id="f" * 32, owner_id=alice) is not None
        assert repository.get_upload(session, upload_id="f" * 32, owner_id=bob) is None


def test_status_and_progress_are_constrained(sessions: sessionmaker[Session]) -> None:
    owner = add_owner(sessions)
    with transaction(sessions) as session:
        repository.ensure_local_principal(session)
        repository.ensure_local_principal(session)  # idempotent
    bad = Job(id="e" * 32, owner_id=owner, status="exploded", model_uri="x", dataset={}, params={},
              request_hash="0" * 64)
    with pytest.raises(IntegrityError), transaction(sessions) as session:
        repository.add_job(session, bad)


def test_a_new_attempt_keeps_the_first_start_and_the_progress_already_shown(sessions: sessionmaker[Session]) -> None:
    owner = add_owner(sessions)
    job_id = add_job(sessions, owner)
    with sessions.begin() as session:
        first = repository.claim_job(session, job_id=job_id, worker_id="w1", lease_s=60)
        assert first is not None
        started = first.started_at
        repository.report_progress(session, job_id=job_id, worker_id="w1", stage="recovery", progress=0.8)
    with sessions.begin() as session:  # the worker is stopped: the job goes back to the queue
        assert repository.hand_back_job(session, job_id=job_id, worker_id="w1", messages=["handed back"])
    with sessions.begin() as session:
        job = repository.get_job(session, job_id=job_id)
        assert job is not None and job.status == "queued" and job.progress == 0.8
        again = repository.claim_job(session, job_id=job_id, worker_id="w2", lease_s=60)
        assert again is not None and again.started_at == started and again.progress == 0.8
        # The new attempt re-counts its stages from their start: what a client sees does not go back.
        repository.report_progress(session, job_id=job_id, worker_id="w2", stage="load", progress=0.1)
    with sessions.begin() as session:
        job = repository.get_job(session, job_id=job_id)
        assert job is not None and (job.stage, job.progress) == ("load", 0.8)
        repository.report_progress(session, job_id=job_id, worker_id="w2", stage="recovery", progress=0.9)
    with sessions() as session:
        job = repository.get_job(session, job_id=job_id)
        assert job is not None and job.progress == 0.9 and job.started_at == started


def test_each_attempt_is_recorded_with_why_it_ended(sessions: sessionmaker[Session]) -> None:
    job_id = add_job(sessions, add_owner(sessions))
    with sessions.begin() as session:
        assert repository.claim_job(session, job_id=job_id, worker_id="w1", lease_s=0.0) is not None
    with sessions.begin() as session:  # w1's lease lapsed: w2 takes the job over before any sweeper looks
        assert repository.claim_job(session, job_id=job_id, worker_id="w2", lease_s=60) is not None
        repository.note_resumed_from(session, job_id=job_id, worker_id="w2", resumed_from="selection")
        repository.note_resumed_from(session, job_id=job_id, worker_id="w1", resumed_from="ignored")  # not its
    with sessions.begin() as session:
        assert repository.hand_back_job(session, job_id=job_id, worker_id="w2", messages=["stopping"])
    with sessions.begin() as session:
        assert repository.claim_job(session, job_id=job_id, worker_id="w3", lease_s=60) is not None
    with sessions.begin() as session:
        assert repository.finish_job(session, job_id=job_id, worker_id="w3", status=JobStatus.failed,
                                     error_code="pipeline_error", error_message="it broke")
    with sessions() as session:
        job = repository.get_job(session, job_id=job_id)
        assert job is not None and job.attempts == 2  # the handed-back attempt was given back
        history = [(a.number, a.worker_id, a.end_reason, a.resumed_from, a.ended_at is not None)
                   for a in job.attempt_history]
        assert history == [(1, "w1", "lost", None, True), (2, "w2", "handed_back", "selection", True),
                           (3, "w3", "failed", None, True)]
        assert job.started_at == job.attempt_history[0].started_at


def test_a_jobs_registrations_are_kept_in_order_with_its_own_first(sessions: sessionmaker[Session]) -> None:
    job_id = add_job(sessions, add_owner(sessions))
    with transaction(sessions) as session:
        repository.claim_job(session, job_id=job_id, worker_id="w1")
    own = {"status": "registered", "model_name": "reviews", "version": "1"}
    with transaction(sessions) as session:
        assert repository.finish_job(session, job_id=job_id, worker_id="w1", status=JobStatus.succeeded,
                                     registration=own)
    for name in ("staging", "reviews"):
        with transaction(sessions) as session:
            repository.set_registration(session, job_id=job_id, registration={**own, "model_name": name})
    with sessions() as session:
        job = repository.get_job(session, job_id=job_id)
        assert job is not None and job.registration == {**own, "model_name": "reviews"}
        assert [r["model_name"] for r in repository.registrations_of(job.registration, job.registration_history)] \
            == ["reviews", "staging", "reviews"]
    # A row from before the list: its one registration stands for it.
    assert repository.registrations_of(own, None) == [own] and repository.registrations_of(None, None) == []
