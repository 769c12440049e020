"""moto's S3 server behind the check real S3 makes of a presigned URL: its signature, then its expiry.

moto's server serves a presigned ``GET`` whatever its ``X-Amz-Signature`` and however old its
``X-Amz-Date`` (it checks no query-string authentication; its IAM mode only reads an
``Authorization`` header). :class:`PresignedUrlCheck` is a WSGI layer that does what S3 does with a
request authenticated in its query string, from AWS's documented Signature Version 4 algorithm
(written here from the documentation, not with botocore's signer, so it does not merely repeat the
code that made the URL): it rebuilds the canonical request, the string to sign and the signing key
from the secret of the access key named in ``X-Amz-Credential``, and answers 403
``SignatureDoesNotMatch`` when the signature differs, 403 ``AccessDenied`` ("Request has expired")
once ``X-Amz-Date + X-Amz-Expires`` has passed. Every other request (the service's own, signed in
its ``Authorization`` header) goes to moto unchanged.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from threading import Thread
from typing import Any
from urllib.parse import quote, unquote

ALGORITHM = "AWS4-HMAC-SHA256"
#: S3's longest presigned URL lifetime, 7 days.
MAX_EXPIRES_S = 7 * 24 * 3600


class PresignedUrlCheck:
    """Wrap a WSGI app: a request with ``X-Amz-Signature`` in its query passes only if S3 would let it."""

    def __init__(self, app: Callable[..., Iterable[bytes]], secrets: Mapping[str, str],
                 clock: Callable[[], float] = time.time) -> None:
        self.app = app
        self.secrets = dict(secrets)  # access key id -> secret access key
        self.clock = clock

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        raw = environ.get("REQUEST_URI") or environ.get("RAW_URI") or environ.get("PATH_INFO", "")
        path, _, query = raw.partition("?")
        if "X-Amz-Signature=" not in query:
            return self.app(environ, start_response)
        refused = refusal(method=environ["REQUEST_METHOD"], path=path, query=query,
                          headers=_headers(environ), secrets=self.secrets, now=self.clock())
        if refused is None:
            return self.app(environ, start_response)
        code, message = refused
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>{message}</Message></Error>").encode()
        start_response("403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]


def refusal(*, method: str, path: str, query: str, headers: Mapping[str, str], secrets: Mapping[str, str],
            now: float) -> tuple[str, str] | None:
    """Why S3 would refuse this presigned request, as ``(code, message)``; None when it would serve it.

    ``path`` and ``query`` are as sent (percent-encoded); ``headers`` lower-cased names to values.
    """
    pairs = [(unquote(k), unquote(v)) for k, _, v in (item.partition("=") for item in query.split("&") if item)]
    params = dict(pairs)
    try:
        credential = params["X-Amz-Credential"]
        amz_date, expires = params["X-Amz-Date"], int(params["X-Amz-Expires"])
        signed_headers, signature = params["X-Amz-SignedHeaders"], params["X-Amz-Signature"]
        signed_at = dt.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC).timestamp()
    except (KeyError, ValueError):
        return "AuthorizationQueryParametersError", "the query-string authentication parameters are incomplete"
    if params.get("X-Amz-Algorithm") != ALGORITHM:
        return "AuthorizationQueryParametersError", f"X-Amz-Algorithm must be {ALGORITHM}"
    if not 1 <= expires <= MAX_EXPIRES_S:
        return "AuthorizationQueryParametersError", "X-Amz-Expires must be between 1 and 604800 seconds"
    key_id, _, scope = credential.partition("/")
    secret = secrets.get(key_id)
    if secret is None:
        return "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records."
    date, region, service, terminal = (scope.split("/") + ["", "", "", ""])[:4]
    if terminal != "aws4_request" or date != amz_date[:8]:
        return "AuthorizationQueryParametersError", "X-Amz-Credential has a malformed scope"
    names = signed_headers.split(";")
    canonical_query = "&".join(f"{_encode(k)}={_encode(v)}"
                               for k, v in sorted(pairs) if k != "X-Amz-Signature")
    canonical_headers = "".join(f"{name}:{' '.join(headers.get(name, '').split())}\n" for name in names)
    canonical_request = "\n".join([method, _canonical_path(path), canonical_query, canonical_headers,
                                   signed_headers, "UNSIGNED-PAYLOAD"])
    string_to_sign = "\n".join([ALGORITHM, amz_date, scope,
                                hashlib.sha256(canonical_request.encode()).hexdigest()])
    key = f"AWS4{secret}".encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    expected = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        return ("SignatureDoesNotMatch",
                "The request signature we calculated does not match the signature you provided.")
    if now > signed_at + expires:
        return "AccessDenied", "Request has expired"
    return None


def _encode(text: str) -> str:
    """URI-encode every byte but the unreserved characters (AWS's ``UriEncode``)."""
    return quote(text, safe="-_.~")


def _canonical_path(path: str) -> str:
    """S3's canonical URI: the path, each segment URI-encoded once (``/`` kept)."""
    return quote(unquote(path), safe="/-_.~") or "/"


def _headers(environ: Mapping[str, Any]) -> dict[str, str]:
    out = {key[5:].replace("_", "-").lower(): str(value) for key, value in environ.items()
           if key.startswith("HTTP_")}
    for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(key):
            out[key.replace("_", "-").lower()] = str(environ[key])
    return out


@contextmanager
def checked_moto_s3_server(secrets: Mapping[str, str]) -> Iterator[str]:
    """moto's S3 server on a free loopback port behind :class:`PresignedUrlCheck`; yields its endpoint URL."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    app = PresignedUrlCheck(DomainDispatcherApplication(create_backend_app), secrets)
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    thread = Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join()
