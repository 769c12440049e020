"""Celery workers: take a job id, run the engine, store artifacts, record the job's state."""
