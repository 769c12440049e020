"""OpenAPI descriptions of the problem responses routes can give."""

from __future__ import annotations

from typing import Any

from app.api.schemas import Problem

_CONTENT = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    described = {400: "Malformed request", 401: "Missing or invalid API key",
                 403: "A signed link that was changed or has expired, or another key's registered model",
                 404: "Not found for this API key",
                 502: "The model registry refused or failed the registration",
                 409: "Conflicts with the job's state", 410: "Removed by the retention sweep",
                 413: "Upload too large", 416: "The range starts past the end",
                 422: "Invalid input; `detail` says what to change",
                 429: "A quota of this key (`code` and `setting` name it); try again after `Retry-After`",
                 503: "Database or broker unreachable",
                 507: "The server ran out of disk space"}
    return {s: {"model": Problem, "description": described[s], "content": _CONTENT} for s in statuses}
