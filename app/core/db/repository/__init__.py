"""Every read and write of the job database, as plain functions over a session.

The API's services and the worker both go through here, so each state change of a job is one
conditional ``UPDATE`` in one place: a transition happens only from the state it starts from
(``WHERE status = 'queued'``...), which is what makes two workers, a worker and a cancel request, or
a worker and the sweeper safe to race. A running job is held by one worker under a lease that the
worker renews; only the holder may write its progress, logs and end, and once the lease has expired
the job may be taken over. Functions never commit; the caller owns the transaction.

One module per topic; everything is re-exported here, so callers write ``repository.get_job(...)``:

- :mod:`.keys` API keys; :mod:`.uploads` uploads;
- :mod:`.jobs` jobs (insert, read, list, cancel, delete, broker marks);
- :mod:`.leases` a running job and its worker (claim, renew, progress, end, take-over);
- :mod:`.attempts` a job's attempts (opened by the claim, closed by what ended each);
- :mod:`.logs` log lines; :mod:`.artifacts` artifact rows and their retention;
- :mod:`.webhooks` webhook endpoints and secrets; :mod:`.events` the webhook outbox and deliveries;
- :mod:`.pieces` the pieces of an accuracy budget's search, run by any worker of the pool.
"""

from __future__ import annotations

from app.core.db.repository._artifacts import (
    ArtifactRecord,
    expire_artifacts,
    get_artifact,
    jobs_with_artifacts_to_expire,
    list_artifacts,
)
from app.core.db.repository._attempts import (
    attempt_rows,
    attempt_rows_sql,
    close_attempt,
    note_resumed_from,
    open_attempt,
)
from app.core.db.repository._events import (
    EVENT_TYPES,
    DueDelivery,
    claim_delivery,
    due_deliveries,
    job_deliveries,
    record_attempt,
    record_event,
)
from app.core.db.repository._fairness import fair_pick, job_owed_before_piece
from app.core.db.repository._jobs import (
    add_job,
    cancel_key_jobs,
    delete_finished_job,
    delete_job,
    find_job_by_idempotency_key,
    get_job,
    job_row,
    job_row_sql,
    list_jobs,
    mark_enqueued,
    mark_not_enqueued,
    queued_jobs_to_send,
    registrations_of,
    request_cancel,
    reserve_registration,
    set_registration,
)
from app.core.db.repository._keys import (
    add_api_key,
    api_key_hash,
    ensure_local_principal,
    get_api_key,
    list_api_keys,
    revoke_api_key,
    touch_api_key,
)
from app.core.db.repository._leases import (
    LostJob,
    ProgressAck,
    cancel_requested,
    claim_job,
    claim_next_job,
    finish_job,
    hand_back_job,
    job_control,
    jobs_with_expired_leases,
    release_lost_job,
    renew_lease,
    report_progress,
    report_target,
)
from app.core.db.repository._logs import append_logs, next_log_line, read_logs
from app.core.db.repository._pieces import (
    NewPiece,
    add_pieces,
    cancel_pieces,
    claim_piece,
    finish_piece,
    get_pieces,
    job_pieces,
    piece_wanted,
    release_piece,
    renew_piece,
    requeue_lost_pieces,
)
from app.core.db.repository._uploads import (
    add_upload,
    complete_upload,
    delete_upload,
    find_upload_by_digest,
    get_upload,
    stale_uploads,
)
from app.core.db.repository._webhooks import (
    add_webhook,
    delete_webhook,
    get_webhook,
    key_webhook_secret,
    list_webhooks,
    secrets_for,
    set_key_webhook_secret,
)

__all__ = [
    "attempt_rows", "attempt_rows_sql", "close_attempt", "note_resumed_from", "open_attempt",
    "add_api_key", "add_job", "add_pieces", "cancel_pieces", "claim_piece", "finish_piece", "get_pieces",
    "job_pieces", "NewPiece", "piece_wanted", "release_piece", "renew_piece", "requeue_lost_pieces",
    "add_upload", "add_webhook", "api_key_hash", "append_logs", "ArtifactRecord",
    "claim_next_job", "fair_pick", "cancel_key_jobs", "job_owed_before_piece",
    "cancel_requested", "claim_delivery", "claim_job", "complete_upload", "delete_finished_job", "delete_job",
    "delete_upload", "delete_webhook", "due_deliveries", "DueDelivery", "ensure_local_principal", "EVENT_TYPES",
    "expire_artifacts", "find_job_by_idempotency_key", "find_upload_by_digest", "finish_job", "get_api_key",
    "get_artifact", "get_job", "get_upload", "get_webhook", "hand_back_job", "job_control", "job_deliveries",
    "job_row", "job_row_sql", "jobs_with_artifacts_to_expire", "jobs_with_expired_leases", "key_webhook_secret",
    "list_api_keys", "list_artifacts", "list_jobs", "list_webhooks", "LostJob", "mark_enqueued", "mark_not_enqueued",
    "next_log_line", "ProgressAck", "queued_jobs_to_send", "read_logs", "record_attempt", "record_event",
    "release_lost_job", "renew_lease", "report_progress", "report_target",
    "request_cancel", "revoke_api_key", "secrets_for",
    "set_key_webhook_secret", "set_registration", "registrations_of", "reserve_registration", "stale_uploads",
    "touch_api_key",
]
