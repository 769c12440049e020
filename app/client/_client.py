"""The job API over HTTP: :class:`ApiClient`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from app.client._exceptions import (
    ClientError,
    InvalidResponseError,
    NotFoundError,
    TransportError,
    WaitTimeoutError,
    httpx_errors,
    problem_from_response,
)
from app.client._records import ArtifactEntry, CheckReport, JobSnapshot, ListPage, LogEntry, Registration, UploadReceipt
from app.client._retries import OUTAGE_S, Outage, retrying
from app.client._sse import ServerSentEvent, parse_sse
from app.client._transfers import download, multipart_file, packed, sha256_of, upload_suffix

#: How long ``register`` waits for the server, which uploads the model to the registry before answering.
REGISTER_TIMEOUT_S = 900.0


class ApiClient:
    """The API over HTTP. ``timeout``: how long one call keeps trying (None: until it succeeds).

    ``on_retry(message)`` hears of each retry, for the command line to say what is going on.
    Every method returns records (:class:`JobSnapshot`, :class:`ArtifactEntry`, :class:`UploadReceipt`,
    :class:`ListPage`) and raises a :class:`ClientError`.
    """

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float | None = 30.0,
                 on_retry: Callable[[str], None] | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Each try gives up on a silent server after a minute; the retry deadline bounds the whole call.
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers,
                                  timeout=httpx.Timeout(60.0, connect=10.0))
        self.timeout = timeout
        self._on_retry = on_retry

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- requests ----------------------------------------------------------------------------------

    def _request(self, method: str, url: str, *, budget: float | None = None,
                 files_factory: Callable[[], Any] | None = None, **kwargs: Any) -> httpx.Response:
        for attempt in retrying(f"{method} {url}", self.timeout if budget is None else budget, self._on_retry):
            with attempt:
                if files_factory is not None:
                    kwargs["files"] = files_factory()  # a fresh file handle for each try
                return self._send(method, url, **kwargs)
        raise AssertionError("unreachable: tenacity re-raises the last error")

    def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        with httpx_errors(f"cannot reach {self._http.base_url}", f"{method} {url} failed"):
            response = self._http.request(method, url, **kwargs)
        if response.status_code >= 400:
            raise problem_from_response(response)
        return response

    def _json(self, method: str, url: str, **kwargs: Any) -> object:
        response = self._request(method, url, **kwargs)
        try:
            return response.json()
        except ValueError as exc:
            raise InvalidResponseError(f"{method} {url}: the answer is not JSON: {response.text[:200]!r}") from exc

    # --- jobs --------------------------------------------------------------------------------------

    def submit(self, body: Mapping[str, Any], *, idempotency_key: str | None = None) -> JobSnapshot:
        """Submit a job (``body`` as ``JobCreate``). With an ``idempotency_key`` (the CLI always sends one)
        a retried submit is safe: the server answers the first job again."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return JobSnapshot.from_json(self._json("POST", "/v1/jobs", json=dict(body), headers=headers))

    def check(self, body: Mapping[str, Any]) -> CheckReport:
        """Check a job as a submit would (``POST /v1/jobs/check``) without queuing it; a 422 is a ProblemError."""
        return CheckReport.from_json(self._json("POST", "/v1/jobs/check", json=dict(body)))

    def job(self, job_id: str, *, budget: float | None = None) -> JobSnapshot:
        return JobSnapshot.from_json(self._json("GET", f"/v1/jobs/{job_id}", budget=budget))

    def cancel(self, job_id: str) -> JobSnapshot:
        return JobSnapshot.from_json(self._json("POST", f"/v1/jobs/{job_id}/cancel"))

    def delete(self, job_id: str) -> None:
        self._request("DELETE", f"/v1/jobs/{job_id}")

    def jobs(self, *, labels: Mapping[str, str] | None = None, status: str | None = None, limit: int = 20,
             cursor: str | None = None) -> ListPage[JobSnapshot]:
        """One page of this key's jobs, newest first; pass ``next_cursor`` as ``cursor`` for the next."""
        params: list[tuple[str, str | int]] = [("limit", limit)]
        params += [("label", f"{k}:{v}") for k, v in (labels or {}).items()]
        if status:
            params.append(("status", status))
        if cursor:
            params.append(("cursor", cursor))
        return ListPage.from_json(self._json("GET", "/v1/jobs", params=params), JobSnapshot.from_json)

    def wait(self, job_id: str, *, timeout: float | None = None, interval: float = 2.0,
             on_update: Callable[[JobSnapshot], None] | None = None) -> JobSnapshot:
        """Poll until the job ends; :class:`WaitTimeoutError` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id, budget=self._outage_budget(deadline))
            if on_update is not None:
                on_update(job)
            if job.finished:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError(f"job {job_id} is still {job.status} after {timeout} s")
            time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))

    def follow(self, job_id: str, *, timeout: float | None = None, on_job: Callable[[JobSnapshot], None] | None = None,
               on_log: Callable[[LogEntry], None] | None = None) -> JobSnapshot:
        """Read the job's event stream until its terminal status, reconnecting where it broke off.

        ``on_log`` gets each log line once, in order, across reconnects (``Last-Event-ID``). The
        server may be away for up to :data:`OUTAGE_S` at a time (reset whenever an event arrives).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last_id = "0"
        outage = Outage(OUTAGE_S, deadline, self._on_retry, f"the event stream of {job_id}")
        while True:
            try:
                for event in self._events(job_id, last_id, deadline):
                    outage.ok()
                    last_id = event.id or last_id
                    if event.event == "log" and on_log is not None:
                        on_log(LogEntry.from_json(_loads(event)))
                    elif event.event in ("status", "stage", "progress"):
                        job = JobSnapshot.from_json(_loads(event))
                        if on_job is not None:
                            on_job(job)
                        if job.finished:
                            return job
                # Ended without a final status: the server is shutting down. Reconnect shortly.
                outage.failed(TransportError("the server closed the event stream"))
            except ClientError as exc:
                outage.failed(exc)  # sleeps before reconnecting, or raises (WaitTimeoutError included)

    def _events(self, job_id: str, last_id: str, deadline: float | None) -> Iterator[ServerSentEvent]:
        # The server sends a comment every 15 s, so a read silent for a minute is a dead connection.
        headers = {"Accept": "text/event-stream", "Last-Event-ID": last_id}
        # Outage names the stream; the error says only what happened to it.
        with httpx_errors("the connection broke"), \
                self._http.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as response:
            if response.status_code >= 400:
                response.read()
                raise problem_from_response(response)
            yield from parse_sse(_until(response.iter_lines(), deadline, job_id))

    def _outage_budget(self, deadline: float | None) -> float:
        """How long one call inside ``wait``/``follow`` may keep trying."""
        if deadline is None:
            return OUTAGE_S
        return max(0.0, min(OUTAGE_S, deadline - time.monotonic()))

    # --- artifacts and uploads ---------------------------------------------------------------------

    def register(self, job_id: str, spec: Mapping[str, Any] | None = None) -> Registration:
        """Register the job's model in the server's MLflow registry (``spec``: ``model_name``, ``tags``,
        ``description``; without it, the ``register`` the job was submitted with)."""
        kwargs: dict[str, Any] = {"json": dict(spec)} if spec is not None else {}
        # One attempt, not retried: a retry after a lost answer would add a second version. The server
        # uploads the model to the registry before it answers, which takes a while for a large model.
        response = self._send("POST", f"/v1/jobs/{job_id}/register", timeout=REGISTER_TIMEOUT_S, **kwargs)
        try:
            return Registration.from_json(response.json())
        except ValueError as exc:
            raise InvalidResponseError(f"POST /v1/jobs/{job_id}/register: the answer is not JSON") from exc

    def artifacts(self, job_id: str) -> tuple[ArtifactEntry, ...]:
        """The job's artifact manifest."""
        return ListPage.from_json(self._json("GET", f"/v1/jobs/{job_id}/artifacts"), ArtifactEntry.from_json).data

    def download(self, job_id: str, artifact: ArtifactEntry, directory: Path) -> Path:
        """Download one artifact into ``directory``, resuming a ``.partial`` file, and check its sha256.

        A transfer that breaks off is resumed with ``Range`` from the bytes already written; the
        server may be away for ``timeout`` seconds at a time (reset whenever bytes arrive). The
        ``.partial`` file is kept on failure, so running the command again resumes too.
        """
        return download(self._http, job_id, artifact, directory, timeout=self.timeout, on_retry=self._on_retry)

    def upload(self, path: Path) -> UploadReceipt:
        """Upload a file, or a directory packed as ``<name>.tar.gz``, unless this key already holds the same bytes."""
        return self.ensure_uploaded(path)[0]

    def ensure_uploaded(self, path: Path) -> tuple[UploadReceipt, bool]:
        """``(upload, sent)``: the upload of ``path``'s bytes, and whether they were sent now.

        A directory is packed deterministically (same files, same bytes), and the server is asked
        first whether this key already holds those bytes (``GET /v1/uploads/sha256:<hex>``); if it
        does, nothing is sent, so a re-run submit names the same ``upload://`` URIs as the first run.
        """
        with packed(path) as file:
            found = self.find_upload(sha256_of(file))
            if found is not None and upload_suffix(found.filename or "") == upload_suffix(file.name):
                return found, False
            with multipart_file(file) as files:
                return UploadReceipt.from_json(self._json("POST", "/v1/uploads", files_factory=files)), True

    def find_upload(self, sha256: str) -> UploadReceipt | None:
        """This key's upload of the bytes whose sha256 is ``sha256`` (hex), or None; other keys' are never found."""
        try:
            return UploadReceipt.from_json(self._json("GET", f"/v1/uploads/sha256:{sha256}"))
        except NotFoundError:
            return None


def _loads(event: ServerSentEvent) -> object:
    try:
        return json.loads(event.data)
    except ValueError as exc:
        raise InvalidResponseError(f"a `{event.event}` event whose data is not JSON: {event.data[:200]!r}") from exc


def _until(lines: Iterable[str], deadline: float | None, job_id: str) -> Iterator[str]:
    """``lines`` until ``deadline``, checked at each line (the server's keep-alive comments included)."""
    for line in lines:
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeoutError(f"job {job_id} has not finished in time")
        yield line
