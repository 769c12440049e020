"""The pieces of an accuracy budget's search in the database, on SQLite and on PostgreSQL: claimed once,
only while their job runs the attempt that asked for them, taken back when their lease lapses, ended with
the job."""

from __future__ import annotations

import threading
import time

from sqlalchemy.orm import Session, sessionmaker

from app.core.db import repository, transaction
from tests.support.rows import running_job


def _add(sessions: sessionmaker[Session], job_id: str, n: int = 2, attempt: int = 1) -> list[str]:
    pieces = [repository.NewPiece(candidate=f"cahp@{i}", piece=0, spec={"k": i}, resume_from=None) for i in range(n)]
    with transaction(sessions) as session:
        return repository.add_pieces(session, job_id=job_id, attempt=attempt, pieces=pieces)


def test_a_piece_is_claimed_once_and_only_its_holder_ends_it(sessions: sessionmaker[Session]) -> None:
    job_id = running_job(sessions, worker="search")
    first, _ = _add(sessions, job_id)
    won: list[str] = []

    def claim(worker: str) -> None:
        with transaction(sessions) as session:
            if repository.claim_piece(session, piece_id=first, worker_id=worker, lease_s=60) is not None:
                won.append(worker)

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1
    with transaction(sessions) as session:
        assert not repository.finish_piece(session, piece_id=first, worker_id="someone else", result={"x": 1})
        assert repository.renew_piece(session, piece_id=first, worker_id=won[0], lease_s=60)
        assert repository.finish_piece(session, piece_id=first, worker_id=won[0], result={"x": 1})
        (row,) = repository.get_pieces(session, piece_ids=[first])
        assert row.status == "done" and row.result == {"x": 1} and row.attempts == 1
        assert repository.claim_piece(session, piece_id=first, worker_id="late", lease_s=60) is None


def test_a_lost_piece_goes_back_to_the_queue_and_is_claimed_again(sessions: sessionmaker[Session]) -> None:
    job_id = running_job(sessions, worker="search")
    first, second = _add(sessions, job_id)
    with transaction(sessions) as session:
        assert repository.claim_piece(session, piece_id=first, worker_id="lost", lease_s=0.05) is not None
        assert repository.claim_piece(session, piece_id=second, worker_id="alive", lease_s=60) is not None
    time.sleep(0.2)
    with transaction(sessions) as session:
        assert repository.requeue_lost_pieces(session, piece_ids=[first, second]) == [first]
        assert not repository.renew_piece(session, piece_id=first, worker_id="lost", lease_s=60)
        again = repository.claim_piece(session, piece_id=first, worker_id="other", lease_s=60)
        assert again is not None and again.attempts == 2 and again.worker_id == "other"
        assert not repository.finish_piece(session, piece_id=first, worker_id="lost", result={})


def test_pieces_of_another_attempt_or_of_a_cancelled_job_are_not_taken(sessions: sessionmaker[Session]) -> None:
    job_id = running_job(sessions, worker="search")
    (stale,) = _add(sessions, job_id, n=1, attempt=0)  # asked for by an attempt that is over
    (current,) = _add(sessions, job_id, n=1, attempt=1)
    with transaction(sessions) as session:
        assert repository.claim_piece(session, piece_id=stale, worker_id="w", lease_s=60) is None
        assert repository.claim_piece(session, piece_id=current, worker_id="w", lease_s=60) is not None
        assert repository.piece_wanted(session, piece_id=current, worker_id="w")
        repository.request_cancel(session, job_id=job_id, owner_id=repository.get_job(session, job_id=job_id).owner_id)
    with transaction(sessions) as session:
        # Its worker learns at the next renewal that the job no longer wants it.
        assert not repository.renew_piece(session, piece_id=current, worker_id="w", lease_s=60)
        assert not repository.piece_wanted(session, piece_id=current, worker_id="w")
        assert repository.cancel_pieces(session, job_id=job_id) == 2
        assert {p.status for p in repository.job_pieces(session, job_id=job_id)} == {"cancelled"}
