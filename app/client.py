"""A small HTTP client of the job API, used by ``cahp submit/status/wait/download/upload``."""

from __future__ import annotations

import hashlib
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

TERMINAL = ("succeeded", "failed", "cancelled")


class ApiError(Exception):
    """A problem+json answer (or a transport failure, with ``status`` 0)."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"{detail} ({code}, HTTP {status})" if status else detail)
        self.status = status
        self.code = code
        self.detail = detail


class ChecksumError(Exception):
    """A downloaded artifact whose sha256 differs from the manifest."""


class ApiClient:
    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 60.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiError(0, "unreachable", f"cannot reach {self._http.base_url}: {exc}") from exc
        if response.status_code >= 400:
            raise _api_error(response)
        return response

    # --- jobs --------------------------------------------------------------------------------------

    def submit(self, body: dict[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        result: dict[str, Any] = self._request("POST", "/v1/jobs", json=body, headers=headers).json()
        return result

    def job(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", f"/v1/jobs/{job_id}").json()
        return result

    def cancel(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("POST", f"/v1/jobs/{job_id}/cancel").json()
        return result

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
            job = self.job(job_id)
            if on_update is not None:
                on_update(job)
            if job["status"] in TERMINAL:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {job['status']} after {timeout} s")
            time.sleep(interval)

    def artifacts(self, job_id: str) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = self._request("GET", f"/v1/jobs/{job_id}/artifacts").json()["data"]
        return data

    def download(self, job_id: str, artifact: dict[str, Any], directory: Path) -> Path:
        """Stream one artifact into ``directory`` and check its sha256 against the manifest entry."""
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / Path(artifact["name"]).name
        partial = target.with_name(target.name + ".partial")
        digest = hashlib.sha256()
        try:
            with self._http.stream("GET", f"/v1/jobs/{job_id}/artifacts/{artifact['name']}") as response:
                if response.status_code >= 400:
                    response.read()
                    raise _api_error(response)
                with open(partial, "wb") as out:
                    for chunk in response.iter_bytes():
                        digest.update(chunk)
                        out.write(chunk)
        except httpx.HTTPError as exc:
            partial.unlink(missing_ok=True)
            raise ApiError(0, "unreachable", f"download of {artifact['name']} failed: {exc}") from exc
        if digest.hexdigest() != artifact["sha256"]:
            partial.unlink(missing_ok=True)
            raise ChecksumError(f"{artifact['name']}: sha256 {digest.hexdigest()} differs from the manifest's "
                                f"{artifact['sha256']}; download it again")
        partial.replace(target)
        return target

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
        with open(path, "rb") as handle:
            result: dict[str, Any] = self._request("POST", "/v1/uploads", files={"file": (path.name, handle)}).json()
        return result


def _api_error(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
        return ApiError(response.status_code, str(body.get("code", "http_error")), str(body.get("detail", body)))
    except ValueError:
        return ApiError(response.status_code, "http_error", response.text[:500] or response.reason_phrase)
