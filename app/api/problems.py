"""One place that turns every error into an ``application/problem+json`` response (RFC 9457).

Each body has ``type``, ``title``, ``status``, ``detail`` and ``code``; ``code`` is the stable
snake_case name clients branch on (the same codes a failed job carries). Validation errors add
``errors``: one ``{loc, msg, type}`` per problem found.
"""

from __future__ import annotations

import logging
import typing
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.core.errors import (
    AuthenticationError,
    ConflictError,
    ForbiddenError,
    GoneError,
    InsufficientStorageError,
    InvalidRequestError,
    PayloadTooLargeError,
    QuotaExceededError,
    RangeNotSatisfiableError,
    RegistryError,
    ResourceNotFoundError,
    ServiceError,
    UnavailableError,
)
from cahp_engine.config import did_you_mean
from cahp_engine.errors import InvalidInputError

logger = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
_HTTP_CODES = {400: "bad_request", 401: "unauthenticated", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 406: "not_acceptable", 409: "conflict", 410: "gone",
               413: "payload_too_large", 415: "unsupported_media_type", 416: "range_not_satisfiable",
               422: "invalid_request", 429: "too_many_requests"}


#: HTTP status of each domain error class; a subclass takes its nearest listed ancestor's.
STATUS_OF: dict[type[ServiceError], int] = {
    AuthenticationError: 401,
    ForbiddenError: 403,
    ResourceNotFoundError: 404,
    ConflictError: 409,
    GoneError: 410,
    PayloadTooLargeError: 413,
    RangeNotSatisfiableError: 416,
    InvalidRequestError: 422,
    QuotaExceededError: 429,
    RegistryError: 502,
    UnavailableError: 503,
    InsufficientStorageError: 507,
    ServiceError: 500,
}


def status_of(exc: ServiceError) -> int:
    """The HTTP status for a domain error (500 for one no class in :data:`STATUS_OF` covers)."""
    return next(STATUS_OF[cls] for cls in type(exc).__mro__ if cls in STATUS_OF)


def problem(
    *, status: int, code: str, title: str, detail: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    body = {"type": f"urn:cahp:problem:{code}", "title": title, "status": status, "detail": detail,
            "code": code, **extra}
    return JSONResponse(jsonable_encoder(body), status_code=status, headers=headers, media_type=PROBLEM_JSON)


def _service_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    headers = None
    if isinstance(exc, AuthenticationError):
        headers = {"WWW-Authenticate": 'Bearer realm="cahp"'}
    elif isinstance(exc, UnavailableError):
        headers = {"Retry-After": "5"}
    elif isinstance(exc, RangeNotSatisfiableError):
        headers = {"Content-Range": f"bytes */{exc.size}", "Accept-Ranges": "bytes"}
    elif isinstance(exc, QuotaExceededError):
        return problem(status=429, code=exc.code, title=exc.title, detail=str(exc),
                       headers={"Retry-After": str(exc.retry_after_s)}, limit=exc.limit, setting=exc.setting)
    return problem(status=status_of(exc), code=exc.code, title=exc.title, detail=str(exc), headers=headers)


def _engine_input_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidInputError)
    return problem(status=422, code=exc.code, title="Invalid job settings", detail=str(exc))


def _advice(error: dict[str, Any], known: Callable[[list[Any]], list[str]] = lambda _loc: []) -> str:
    """One validation error as a sentence that says what to change; ``known(loc)``: the fields beside ``loc``."""
    where = ".".join(str(p) for p in error["loc"])
    if error["type"] == "json_invalid":
        at = error["loc"][-1] if error["loc"] and isinstance(error["loc"][-1], int) else "?"
        return (f"the body is not valid JSON (it breaks at character {at}); send one JSON object, "
                'like {"model": {"uri": ...}, "dataset": {"uri": ...}, "params": {...}}')
    if error["type"] == "extra_forbidden":
        hint = did_you_mean(str(error["loc"][-1]), known(list(error["loc"])))
        return f"`{where}` is not a field this API knows{hint or '; remove it'} (the schema is at /docs)"
    if error["type"] == "missing":
        return f"`{where}` is required; add it"
    return f"`{where}`: {error['msg']}"


def _fields_beside(request: Request) -> Callable[[list[Any]], list[str]]:
    """``loc -> the field names of the body model that holds loc's last part`` for this request's route."""

    def known(loc: list[Any]) -> list[str]:
        route = request.scope.get("route")
        model = getattr(getattr(getattr(route, "body_field", None), "field_info", None), "annotation", None)
        if not loc or loc[0] != "body":
            return []
        for part in loc[1:-1]:
            fields = getattr(model, "model_fields", None)
            if not isinstance(fields, dict) or part not in fields:
                return []
            model = fields[part].annotation
            # `X | None`: the model among the union's members.
            model = next((m for m in typing.get_args(model) if hasattr(m, "model_fields")), model)
        fields = getattr(model, "model_fields", None)
        return list(fields) if isinstance(fields, dict) else []

    return known


def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
              for e in exc.errors()]
    known = _fields_beside(request)
    shown = "; ".join(_advice(e, known) for e in errors[:5])
    return problem(status=422, code="invalid_request", title="Invalid request",
                   detail=shown or "the request is not valid", errors=errors)


def _database_error(_request: Request, exc: Exception) -> JSONResponse:
    # Connection failures, and SQLite still locked after its busy timeout under heavy load.
    logger.warning("database error: %s", exc)
    return problem(status=503, code="service_unavailable", title="Service unavailable",
                   detail="the job database is unreachable or overloaded; try again shortly",
                   headers={"Retry-After": "5"})


def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    title = code.replace("_", " ").capitalize()
    detail = str(exc.detail)
    if exc.status_code == 400 and isinstance(exc.__cause__, RecursionError):
        return _too_deep(_request, exc.__cause__)
    if exc.status_code == 400 and "parsing the body" in detail:
        # FastAPI's words for a body it cannot decode at all (e.g. bytes that are not UTF-8).
        detail = ("the request body cannot be read; send UTF-8 JSON with Content-Type: application/json "
                  "(uploads: multipart/form-data with the field `file`)")
    return problem(status=exc.status_code, code=code, title=title, detail=detail,
                   headers=dict(exc.headers) if exc.headers else None)


def _too_deep(_request: Request, _exc: Exception) -> JSONResponse:
    # Python's JSON reader (and any walk over what it read) recurses once per level: a body nested
    # thousands deep is refused whole, as input to change, never a 500.
    return problem(status=400, code="nesting_too_deep", title="Nesting too deep",
                   detail="the request nests JSON arrays or objects too deeply to be read (a few hundred levels at "
                          "most); send a flatter body")


def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error", exc_info=exc)
    return problem(status=500, code="internal_error", title="Internal error",
                   detail="the server failed to handle the request; the error is in its log")


def install_problem_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(InvalidInputError, _engine_input_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(OperationalError, _database_error)
    app.add_exception_handler(RecursionError, _too_deep)
    app.add_exception_handler(Exception, _unexpected)
