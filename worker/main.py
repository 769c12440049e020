"""The worker's Celery app, for ``celery -A worker.main worker`` (``cahp worker`` uses it too)."""

from __future__ import annotations

from app.core.settings import get_settings
from worker.celery_app import make_celery

app = make_celery(get_settings(), with_tasks=True)
