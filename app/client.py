"""A small HTTP client of the job API, used by ``cahp submit/status/wait/download/upload``.

It survives what a deploy or a flaky network does to a long CI job. Every call is retried on a
connection error and on 429, 502, 503 and 504, with exponential back-off and jitter, waiting at
least what ``Retry-After`` asks (tenacity does the retrying), until ``timeout`` seconds have passed
since the call began. ``wait`` keeps going for as long as the job runs, and tolerates the server
being away for up to :data:`OUTAGE_S` at a time. A download resumes where it broke off (HTTP
``Range``, ``If-Range`` on the artifact's sha256) and is checked against the manifest's sha256.

Imports nothing of the service or the engine: a CI loop calls ``cahp status`` often.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import random
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay

TERMINAL = ("succeeded", "failed", "cancelled")
#: Answers worth another try: too many requests, and a gateway or server that is briefly away.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: Longest ``wait`` goes on trying while the server does not answer (an API restart, a deploy).
OUTAGE_S = 300.0
#: Back-off between tries: first, then doubling up to the cap, each with up to 50 % jitter.
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.5, 10.0


class ApiError(Exception):
    """A problem+json answer (or a transport failure, with ``status`` 0)."""

    def __init__(self, status: int, code: str, detail: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"{detail} ({code}, HTTP {status})" if status else detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.retry_after = retry_after


class ChecksumError(Exception):
    """A downloaded artifact whose sha256 differs from the manifest."""


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiError):
        return exc.code == "unreachable" if exc.status == 0 else exc.status in RETRY_STATUSES
    return isinstance(exc, httpx.TransportError)


def backoff_s(tries: int, retry_after: float | None = None) -> float:
    """Seconds to wait after ``tries`` failed tries: doubling from the first, capped, jittered, and
    never less than the server's ``Retry-After``."""
    delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** max(0, tries - 1)) * (1 + random.random() / 2)
    return max(delay, retry_after) if retry_after is not None else delay


def retry_after_s(value: str | None) -> float | None:
    """``Retry-After`` in seconds: a number of seconds or an HTTP date (RFC 9110 section 10.2.3)."""
    if not value:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():  # not "²", which isdigit() accepts and float() refuses
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class ApiClient:
    """The API over HTTP. ``timeout``: how long one call keeps trying (None: until it succeeds).

    ``on_retry(message)`` hears of each retry, for the command line to say what is going on.
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

    # --- retrying ----------------------------------------------------------------------------------

    def _retrying(self, what: str, budget: float | None) -> Retrying:
        """Tenacity's loop for one request: transient failures again, until ``budget`` seconds have passed."""

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome is not None else None
            delay = backoff_s(state.attempt_number, exc.retry_after if isinstance(exc, ApiError) else None)
            elapsed = state.seconds_since_start or 0.0
            return delay if budget is None else min(delay, max(0.0, budget - elapsed))

        def tell(state: RetryCallState) -> None:
            if self._on_retry is not None and state.outcome is not None and state.next_action is not None:
                self._on_retry(f"{what}: {state.outcome.exception()}; trying again in {state.next_action.sleep:.1f} s")

        stop = stop_after_delay(budget) if budget is not None else (lambda _state: False)
        return Retrying(retry=retry_if_exception(_transient), wait=wait, stop=stop, before_sleep=tell, reraise=True)

    def _request(self, method: str, url: str, *, budget: float | None = None, **kwargs: Any) -> httpx.Response:
        files: Callable[[], Any] | None = kwargs.pop("files_factory", None)
        for attempt in self._retrying(f"{method} {url}", self.timeout if budget is None else budget):
            with attempt:
                if files is not None:
                    kwargs["files"] = files()  # a fresh file handle for each try
                return self._send(method, url, **kwargs)
        raise AssertionError("unreachable: tenacity re-raises the last error")

    def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            raise ApiError(0, "unreachable", f"cannot reach {self._http.base_url}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise ApiError(0, "http_error", f"{method} {url} failed: {exc}") from exc
        if response.status_code >= 400:
            raise _api_error(response)
        return response

    # --- jobs --------------------------------------------------------------------------------------

    def submit(self, body: dict[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Submit a job. With an ``idempotency_key`` (the CLI always sends one) a retried submit is safe."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        result: dict[str, Any] = self._request("POST", "/v1/jobs", json=body, headers=headers).json()
        return result

    def job(self, job_id: str, *, budget: float | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", f"/v1/jobs/{job_id}", budget=budget).json()
        return result

    def cancel(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("POST", f"/v1/jobs/{job_id}/cancel").json()
        return result

    def delete(self, job_id: str) -> None:
        self._request("DELETE", f"/v1/jobs/{job_id}")

    def jobs(self, *, labels: dict[str, str] | None = None, status: str | None = None,
             limit: int = 20) -> list[dict[str, Any]]:
        params: list[tuple[str, str | int]] = [("limit", limit)]
        params += [("label", f"{k}:{v}") for k, v in (labels or {}).items()]
        if status:
            params.append(("status", status))
        data: list[dict[str, Any]] = self._request("GET", "/v1/jobs", params=params).json()["data"]
        return data

    def wait(
        self,
        job_id: str,
        *,
        timeout: float | None = None,
        interval: float = 2.0,
        on_update: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll until the job ends; TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id, budget=self._outage_budget(deadline))
            if on_update is not None:
                on_update(job)
            if job["status"] in TERMINAL:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {job['status']} after {timeout} s")
            time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))

    def follow(
        self,
        job_id: str,
        *,
        timeout: float | None = None,
        on_job: Callable[[dict[str, Any]], None] | None = None,
        on_log: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Read the job's event stream until its terminal status, reconnecting where it broke off.

        ``on_log`` gets each log line once, in order, across reconnects (``Last-Event-ID``). The
        server may be away for up to :data:`OUTAGE_S` at a time (reset whenever an event arrives).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last_id = "0"
        outage = _Outage(OUTAGE_S, deadline, self._on_retry, f"the event stream of {job_id}")
        while True:
            try:
                for event_id, kind, data in self._events(job_id, last_id, deadline):
                    outage.ok()
                    last_id = event_id or last_id
                    if kind == "log" and on_log is not None:
                        on_log(json.loads(data))
                    elif kind in ("status", "stage", "progress"):
                        job: dict[str, Any] = json.loads(data)
                        if on_job is not None:
                            on_job(job)
                        if job["status"] in TERMINAL:
                            return job
                # Ended without a final status: the server is shutting down. Reconnect shortly.
                outage.failed(ApiError(0, "unreachable", "the server closed the event stream"))
            except ApiError as exc:
                outage.failed(exc)

    def _events(self, job_id: str, last_id: str, deadline: float | None) -> Iterator[tuple[str, str, str]]:
        # The server sends a comment every 15 s, so a read silent for a minute is a dead connection.
        headers = {"Accept": "text/event-stream", "Last-Event-ID": last_id}
        try:
            with self._http.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _api_error(response)
                yield from _parse_sse(response.iter_lines(), deadline, job_id)
        except httpx.TransportError as exc:
            raise ApiError(0, "unreachable", f"the event stream of {job_id} broke: {exc}") from exc

    def _outage_budget(self, deadline: float | None) -> float:
        """How long one call inside ``wait``/``follow`` may keep trying."""
        if deadline is None:
            return OUTAGE_S
        return max(0.0, min(OUTAGE_S, deadline - time.monotonic()))

    # --- artifacts ---------------------------------------------------------------------------------

    def artifacts(self, job_id: str) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = self._request("GET", f"/v1/jobs/{job_id}/artifacts").json()["data"]
        return data

    def download(self, job_id: str, artifact: dict[str, Any], directory: Path) -> Path:
        """Download one artifact into ``directory``, resuming a ``.partial`` file, and check its sha256.

        A transfer that breaks off is resumed with ``Range`` from the bytes already written; the
        server may be away for ``timeout`` seconds at a time (reset whenever bytes arrive). The
        ``.partial`` file is kept on failure, so running the command again resumes too.
        """
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / Path(artifact["name"]).name
        partial = target.with_name(target.name + ".partial")
        size, etag = int(artifact["size"]), f'"{artifact["sha256"]}"'
        url = f"/v1/jobs/{job_id}/artifacts/{artifact['name']}"
        outage = _Outage(self.timeout, None, self._on_retry, f"the download of {artifact['name']}")
        while True:
            have = partial.stat().st_size if partial.exists() else 0
            if have > size:
                partial.unlink()
                have = 0
            if have == size:
                break
            try:
                self._fetch(url, partial, have=have, etag=etag)
            except ApiError as exc:
                if (partial.stat().st_size if partial.exists() else 0) > have:
                    outage.ok()  # it was making progress: a new break, not a longer outage
                outage.failed(exc)
        digest = _sha256(partial)
        if digest != artifact["sha256"]:
            partial.unlink(missing_ok=True)
            raise ChecksumError(f"{artifact['name']}: sha256 {digest} differs from the manifest's "
                                f"{artifact['sha256']}; download it again")
        partial.replace(target)
        return target

    def _fetch(self, url: str, partial: Path, *, have: int, etag: str) -> None:
        """One GET of the rest of the artifact, appended to ``partial``; raises on a broken transfer."""
        headers = {"Range": f"bytes={have}-", "If-Range": etag} if have else {}
        try:
            with self._http.stream("GET", url, headers=headers) as response:
                if response.status_code == 416:
                    partial.unlink(missing_ok=True)  # our partial file is not a prefix of it: start again
                    raise ApiError(0, "unreachable", "the partial download does not fit the artifact; restarting")
                if response.status_code >= 400:
                    response.read()
                    raise _api_error(response)
                resume = response.status_code == 206 and response.headers.get("content-range", "").startswith(
                    f"bytes {have}-")
                with open(partial, "ab" if resume else "wb") as out:
                    for chunk in response.iter_bytes():
                        out.write(chunk)
        except httpx.TransportError as exc:
            raise ApiError(0, "unreachable", f"the download broke off: {exc}") from exc

    # --- uploads -----------------------------------------------------------------------------------

    def upload(self, path: Path) -> dict[str, Any]:
        """Upload a file, or a directory packed as ``<name>.tar.gz``; returns the upload record."""
        if path.is_dir():
            with tempfile.TemporaryDirectory(prefix="cahp-pack-") as tmp:
                archive = Path(tmp) / f"{path.resolve().name or 'upload'}.tar.gz"
                with tarfile.open(archive, "w:gz") as tar:
                    tar.add(path, arcname=path.resolve().name or "upload")
                return self._upload_file(archive)
        return self._upload_file(path)

    def _upload_file(self, path: Path) -> dict[str, Any]:
        handles: list[Any] = []

        def files() -> dict[str, Any]:
            handles.append(open(path, "rb"))  # noqa: SIM115 - closed below, after every try
            return {"file": (path.name, handles[-1])}

        try:
            result: dict[str, Any] = self._request("POST", "/v1/uploads", files_factory=files).json()
        finally:
            for handle in handles:
                handle.close()
        return result


class _Outage:
    """How long the server has been away during a stream; reset when it answers again."""

    def __init__(self, budget: float | None, deadline: float | None, on_retry: Callable[[str], None] | None,
                 what: str) -> None:
        self._budget, self._deadline, self._on_retry, self._what = budget, deadline, on_retry, what
        self._since: float | None = None
        self._tries = 0

    def ok(self) -> None:
        self._since, self._tries = None, 0

    def failed(self, exc: ApiError) -> None:
        """Sleep before the next try, or raise ``exc`` when it is not transient or time is up."""
        if not _transient(exc):
            raise exc
        now = time.monotonic()
        self._since = now if self._since is None else self._since
        self._tries += 1
        left = [t for t in (None if self._budget is None else self._since + self._budget - now,
                            None if self._deadline is None else self._deadline - now) if t is not None]
        if left and min(left) <= 0:
            if self._deadline is not None and now >= self._deadline:
                raise TimeoutError(f"{self._what}: gave up at the timeout; last error: {exc}") from exc
            raise exc
        delay = backoff_s(self._tries, exc.retry_after)
        delay = min([delay, *left])
        if self._on_retry is not None:
            self._on_retry(f"{self._what}: {exc}; trying again in {delay:.1f} s")
        time.sleep(delay)


def _parse_sse(lines: Iterator[str], deadline: float | None, job_id: str) -> Iterator[tuple[str, str, str]]:
    """``(id, event, data)`` of each event of a ``text/event-stream`` (comments and ``retry`` skipped)."""
    event_id, kind = "", "message"
    data: list[str] = []
    for line in lines:
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"job {job_id} has not finished in time")
        if not line:
            if data:
                yield event_id, kind, "\n".join(data)
            event_id, kind, data = "", "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            event_id = value
        elif name == "event":
            kind = value
        elif name == "data":
            data.append(value)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def _api_error(response: httpx.Response) -> ApiError:
    retry_after = retry_after_s(response.headers.get("retry-after"))
    try:
        body = response.json()
        return ApiError(response.status_code, str(body.get("code", "http_error")), str(body.get("detail", body)),
                        retry_after=retry_after)
    except ValueError:
        return ApiError(response.status_code, "http_error", response.text[:500] or response.reason_phrase,
                        retry_after=retry_after)
