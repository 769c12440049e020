"""Which class of :class:`ClientError` an answer or a failure becomes, and the event-stream parser."""

from __future__ import annotations

import httpx
import pytest

from app.client import (
    AuthError,
    BadRequestError,
    ClientError,
    InvalidResponseError,
    NotFoundError,
    ProblemError,
    RateLimitedError,
    ServerError,
    ServerSentEvent,
    TransportError,
    WaitTimeoutError,
    parse_sse,
)
from app.client._exceptions import httpx_errors, problem_from_response
from app.client._retries import is_transient


@pytest.mark.parametrize(("status", "kind"), [
    (400, BadRequestError), (409, BadRequestError), (413, BadRequestError), (415, BadRequestError),
    (416, BadRequestError), (422, BadRequestError), (418, BadRequestError), (401, AuthError), (403, AuthError),
    (404, NotFoundError), (410, NotFoundError), (429, RateLimitedError), (500, ServerError), (502, ServerError),
    (503, ServerError), (504, ServerError), (507, ServerError),
])
def test_a_problem_answer_becomes_the_class_of_its_status_family(status: int, kind: type[ProblemError]) -> None:
    response = httpx.Response(status, json={"type": "urn:cahp:problem:x", "title": "X", "status": status,
                                            "detail": "what happened", "code": "some_code"},
                              headers={"Retry-After": "7"})
    problem = problem_from_response(response)
    assert type(problem) is kind and isinstance(problem, ClientError)
    assert (problem.status, problem.code, problem.detail, problem.retry_after) == (status, "some_code",
                                                                                  "what happened", 7.0)
    assert str(problem) == f"what happened (some_code, HTTP {status})"
    assert is_transient(problem) == (status in {429, 502, 503, 504})


def test_a_problem_whose_body_is_not_problem_json_keeps_its_text() -> None:
    problem = problem_from_response(httpx.Response(502, text="<html>Bad gateway</html>"))
    assert isinstance(problem, ServerError) and problem.code == "http_error" and "Bad gateway" in problem.detail
    assert problem_from_response(httpx.Response(400, json=["a", "list"])).code == "http_error"


def test_httpx_failures_become_transport_or_invalid_response_errors() -> None:
    request = httpx.Request("GET", "http://x/v1/jobs")
    with pytest.raises(TransportError, match="cannot reach x: refused") as caught:
        with httpx_errors("cannot reach x"):
            raise httpx.ConnectError("refused", request=request)
    assert is_transient(caught.value)
    with pytest.raises(TransportError, match="timed out"), httpx_errors("cannot reach x"):
        raise httpx.ReadTimeout("timed out", request=request)
    with pytest.raises(InvalidResponseError, match="GET /v1/jobs failed") as unreadable:
        with httpx_errors("cannot reach x", "GET /v1/jobs failed"):
            raise httpx.DecodingError("bad gzip", request=request)
    assert not is_transient(unreadable.value)
    assert isinstance(WaitTimeoutError("late"), TimeoutError) and not is_transient(WaitTimeoutError("late"))


def test_the_event_stream_parser_reads_ids_types_and_multi_line_data() -> None:
    lines = [": keep-alive", "retry: 1000", "id: 4", "event: log", 'data: {"offset": 3,', 'data: "message": "x"}',
             "", "event: status", "data:{}", "", "id: 9", "", "data: tail"]
    assert list(parse_sse(lines)) == [ServerSentEvent("4", "log", '{"offset": 3,\n"message": "x"}'),
                                      ServerSentEvent("", "status", "{}")]
