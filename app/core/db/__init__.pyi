"""The job database: the engine and sessions, the tables, and every read and write of them.

Reading order: ``_database`` (``make_engine``, ``transaction``, ``upgrade_database``: SQLAlchemy and
Alembic) -> ``_models`` (the tables: ``Job``, ``ApiKey``, ``Upload``, ``Artifact``...) -> ``repository``
(every state change as a conditional ``UPDATE``; callers write ``repository.claim_job(...)``)."""

from . import repository
from ._database import (
    SQLITE_BUSY_TIMEOUT_S,
    Base,
    make_engine,
    make_session_factory,
    migrations_dir,
    transaction,
    upgrade_database,
    utcnow,
)
from ._models import (
    ApiKey,
    Artifact,
    AttemptEnd,
    BudgetPiece,
    Job,
    JobAttempt,
    JobEvent,
    JobLabel,
    JobLog,
    JobStatus,
    Upload,
    Webhook,
    WebhookAttempt,
    WebhookDelivery,
)

__all__ = [
    "ApiKey", "Artifact", "AttemptEnd", "Base", "BudgetPiece", "Job", "JobAttempt", "JobEvent", "JobLabel", "JobLog",
    "JobStatus", "make_engine",
    "make_session_factory", "migrations_dir", "repository", "SQLITE_BUSY_TIMEOUT_S", "transaction",
    "upgrade_database", "Upload", "utcnow", "Webhook", "WebhookAttempt", "WebhookDelivery",
]
