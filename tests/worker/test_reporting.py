"""Throttled progress, log and cancel-flag traffic between the engine's hooks and the job row."""

from __future__ import annotations

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import Job, repository, transaction
from tests.support.rows import Clock, job_row, running_job
from worker.reporting import MAX_LOG_LINE, JobReporter


def _reporter(sessions: sessionmaker[Session], job_id: str, clock: Clock, **kwargs: float) -> JobReporter:
    values = {"progress_interval_s": 10.0, "cancel_check_interval_s": 5.0, "time_limit_s": 1000.0} | kwargs
    return JobReporter(sessions, job_id=job_id, worker_id="w", clock=clock, **values)


def test_progress_is_written_on_stage_changes_and_then_at_most_every_interval(sessions: sessionmaker[Session]) -> None:
    job_id, clock = running_job(sessions), Clock()
    reporter = _reporter(sessions, job_id, clock)
    reporter.progress("recovery", 0.5)
    assert (job_row(sessions, job_id).stage, job_row(sessions, job_id).progress) == ("recovery", 0.5)
    for step in range(100):
        clock.now += 0.01
        reporter.progress("recovery", 0.5 + step / 1000)
    assert job_row(sessions, job_id).progress == 0.5  # throttled: nothing written within the interval
    clock.now += 10
    reporter.progress("recovery", 0.7)
    assert job_row(sessions, job_id).progress == 0.7
    reporter.progress("evaluation", 0.9)  # a new stage is written at once
    assert (job_row(sessions, job_id).stage, job_row(sessions, job_id).progress) == ("evaluation", 0.9)


def test_log_lines_are_batched_and_flushed(sessions: sessionmaker[Session]) -> None:
    job_id, clock = running_job(sessions), Clock()
    reporter = _reporter(sessions, job_id, clock)
    reporter.log("first")  # the first write goes out at once
    reporter.log("second\nthird")
    reporter.log("x" * (MAX_LOG_LINE + 10))
    with sessions() as session:
        assert [r.message for r in repository.read_logs(session, job_id=job_id, offset=0, limit=10)] == ["first"]
    reporter.flush()
    with sessions() as session:
        lines = repository.read_logs(session, job_id=job_id, offset=0, limit=10)
    assert [r.message for r in lines][:3] == ["first", "second", "third"]
    assert lines[3].message.endswith("[...]") and len(lines[3].message) < MAX_LOG_LINE + 10
    # A second reporter for the same job continues the numbering.
    other = _reporter(sessions, job_id, clock)
    other.log("later")
    with sessions() as session:
        assert repository.read_logs(session, job_id=job_id, offset=4, limit=10)[0].message == "later"


def test_the_cancel_flag_is_read_at_most_every_interval(sessions: sessionmaker[Session]) -> None:
    job_id, clock = running_job(sessions), Clock()
    reporter = _reporter(sessions, job_id, clock)
    assert reporter.should_cancel() is False
    with transaction(sessions) as session:
        session.execute(update(Job).where(Job.id == job_id).values(cancel_requested=True))
    clock.now += 1
    assert reporter.should_cancel() is False  # not read again yet
    clock.now += 5
    assert reporter.should_cancel() is True and reporter.stop_reason == "cancel_requested"


def test_losing_the_job_or_the_time_limit_stops_the_run(sessions: sessionmaker[Session]) -> None:
    job_id, clock = running_job(sessions), Clock()
    reporter = _reporter(sessions, job_id, clock, cancel_check_interval_s=0.0)
    with transaction(sessions) as session:
        session.execute(update(Job).where(Job.id == job_id).values(worker_id="someone-else"))
    assert reporter.should_cancel() is True and reporter.stop_reason == "lost"
    timed = _reporter(sessions, running_job(sessions), clock, time_limit_s=60.0)
    assert timed.should_cancel() is False
    clock.now += 61
    assert timed.should_cancel() is True and timed.stop_reason == "time_limit"


def test_the_time_left_comes_from_the_stages_throughput_within_the_first_minute(
    sessions: sessionmaker[Session],
) -> None:
    from cahp_engine.config import PruningConfig
    from cahp_engine.progress import stage_plan

    config = PruningConfig(epochs=1, dense_epochs=1, dense_finetune="always", export="none")
    plan = stage_plan(config)  # the run's plan until it hears the one of its rows
    spans, costs = plan.spans, plan.costs

    def overall(stage: str, fraction: float) -> float:
        lo, hi = spans[stage]
        return lo + (hi - lo) * fraction

    job_id, clock = running_job(sessions), Clock()
    reporter = _reporter(sessions, job_id, clock, progress_interval_s=0.0)
    reporter.measure_stages(config)
    reporter.progress("load", overall("load", 0.0))
    assert job_row(sessions, job_id).eta_s is None  # nothing measured yet
    clock.now += costs["load"]  # loading over: nothing measured yet, so the calibration's speed (1)
    reporter.progress("load", overall("load", 1.0))
    reporter.progress("dense_finetune", overall("dense_finetune", 0.0))
    later = sum(cost for stage, cost in costs.items() if spans[stage][0] >= spans["dense_finetune"][0])
    assert job_row(sessions, job_id).eta_s == later  # seconds into the job, every stage still to come
    fraction = 0.0
    for _ in range(20):  # dense fine-tuning goes twice as fast as calibrated
        clock.now += costs["dense_finetune"] / 100
        fraction += 0.02
        reporter.progress("dense_finetune", overall("dense_finetune", fraction))
    # Its own rate for what is left of it; every later stage at its speed (x0.5), the fixed-cost ones
    # included: the loading's time (as calibrated) says nothing of theirs.
    after = {stage: cost for stage, cost in costs.items() if spans[stage][0] >= spans["dense_finetune"][1]
             and spans[stage][1] > spans[stage][0]}
    expected = 0.6 * costs["dense_finetune"] / 2 + 0.5 * sum(after.values())
    assert job_row(sessions, job_id).eta_s == pytest.approx(expected)


def test_the_time_left_follows_the_plan_the_run_moves_to_once_it_knows_its_rows(
    sessions: sessionmaker[Session],
) -> None:
    from cahp_engine.config import PruningConfig
    from cahp_engine.progress import CALIBRATION_ROWS, RowCounts, stage_plan

    config = PruningConfig(epochs=1, dense_epochs=1, dense_finetune="always", export="none")
    first = stage_plan(config)
    plan = stage_plan(config, RowCounts(train=CALIBRATION_ROWS.train // 4, evaluation=CALIBRATION_ROWS.evaluation))
    job_id, clock = running_job(sessions), Clock()
    reporter = _reporter(sessions, job_id, clock, progress_interval_s=0.0)
    reporter.measure_stages(config)
    reporter.progress("load", 0.0)
    clock.now += first.costs["load"]  # nothing measured yet: the calibration's speed (1)
    reporter.progress("load", first.spans["load"][1])
    calibrated = job_row(sessions, job_id).eta_s
    reporter.plan(plan)  # the engine's plan hook, as loading ends
    reporter.progress("dense_finetune", plan.spans["dense_finetune"][0])
    eta = job_row(sessions, job_id).eta_s
    assert eta == pytest.approx(sum(cost for stage, cost in plan.costs.items() if stage != "load"))
    assert calibrated is not None and eta < calibrated  # a quarter of the rows: less to do
    # The job's progress goes on from where loading left it.
    assert job_row(sessions, job_id).progress == pytest.approx(first.spans["load"][1])
