"""The guard on every URL the service itself connects to: the S3 endpoint, the model hub and webhook receivers.

A server that fetches from a configurable address can be turned against its own network (SSRF):
the cloud metadata service at 169.254.169.254 hands out credentials, and services bound to
loopback trust their callers. So an outbound URL whose host is, or resolves to, a loopback,
link-local, unspecified or metadata address is refused unless the operator lists that host in
``CAHP_ALLOWED_OUTBOUND_HOSTS`` (a local MinIO on 127.0.0.1, for example). Every address a name
resolves to is checked, so odd spellings (``0x7f000001``, ``[::ffff:127.0.0.1]``) and names that
point at such addresses are caught too. The check runs when a client for the URL is made; a name
whose DNS answer changes afterwards is outside what it can see.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from app.core.errors import OutboundUrlRefusedError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Networks never reached without an explicit allowance, with what they are.
REFUSED_NETWORKS = tuple((ipaddress.ip_network(n), kind) for n, kind in (
    ("127.0.0.0/8", "loopback"), ("::1/128", "loopback"),
    # Link-local holds the cloud metadata service (169.254.169.254) on AWS, GCP and Azure.
    ("169.254.0.0/16", "link-local"), ("fe80::/10", "link-local"),
    ("0.0.0.0/8", "unspecified"), ("::/128", "unspecified"),
    ("fd00:ec2::254/128", "cloud metadata"),    # AWS over IPv6
    ("100.100.100.200/32", "cloud metadata"),   # Alibaba Cloud
    ("192.0.0.192/32", "cloud metadata"),       # Oracle Cloud
))
#: Names of metadata services, refused even when they do not resolve here.
REFUSED_NAMES = frozenset({"metadata", "metadata.google.internal", "metadata.goog", "instance-data",
                           "instance-data.ec2.internal"})

Resolver = Callable[[str], Iterable[str]]


def _resolve(host: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        # Unresolvable here means unreachable here: nothing to protect.
        return []
    return [str(info[4][0]) for info in infos]


def _address(text: str) -> IPAddress | None:
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone index
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def refused_reason(address: IPAddress) -> str | None:
    """Why ``address`` may not be reached without an allowance, or None when it may."""
    for network, kind in REFUSED_NETWORKS:
        if address.version == network.version and address in network:
            return f"{address} is a {kind} address"
    return None


def _allowed(host: str, addresses: Sequence[IPAddress], allowed: Sequence[str]) -> bool:
    for entry in allowed:
        if entry.lower() == host:
            return True
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            continue
        if addresses and all(a.version == network.version and a in network for a in addresses):
            return True
    return False


def check_outbound_url(url: str, *, allowed_hosts: Sequence[str], what: str, resolve: Resolver = _resolve) -> None:
    """Refuse ``url`` if it leads to a loopback, link-local or metadata address not allowed.

    Parameters
    ----------
    url : the URL the service is about to connect to
    allowed_hosts : ``CAHP_ALLOWED_OUTBOUND_HOSTS``: names, addresses or CIDR networks
    what : what the URL is for, e.g. ``"CAHP_S3_ENDPOINT_URL"``, to name it in the message

    Raises
    ------
    OutboundUrlRefusedError
        With the address found and the setting that would allow it.
    """
    try:
        host = (urlsplit(url).hostname or "").rstrip(".").lower()
    except ValueError as exc:
        raise OutboundUrlRefusedError(f"{what} {url!r} is not a valid URL: {exc}") from exc
    if not host:
        raise OutboundUrlRefusedError(f"{what} {url!r} has no host")
    literal = _address(host)
    candidates = [literal] if literal is not None else [a for a in map(_address, resolve(host)) if a is not None]
    if _allowed(host, candidates, allowed_hosts):
        return
    reasons = [r for r in map(refused_reason, candidates) if r is not None]
    if host in REFUSED_NAMES:
        reasons.insert(0, f"{host} is a cloud metadata service")
    if reasons:
        raise OutboundUrlRefusedError(
            f"{what} {url!r} is refused: {reasons[0]}, which this server does not connect to; if that is "
            f"really intended (e.g. a local MinIO), add {host!r} to CAHP_ALLOWED_OUTBOUND_HOSTS"
        )


def check_hub_endpoint(*, allowed_hosts: Sequence[str], hub: Any = None) -> None:
    """Apply :func:`check_outbound_url` to the Hugging Face endpoint, unless the hub is offline.

    ``hub`` is ``huggingface_hub.constants`` (read at call time: ``HF_ENDPOINT`` is taken when that
    module is imported).
    """
    if hub is None:
        from huggingface_hub import constants as hub
    if hub.HF_HUB_OFFLINE:
        return  # no request is made
    check_outbound_url(hub.ENDPOINT, allowed_hosts=allowed_hosts, what="the Hugging Face endpoint (HF_ENDPOINT)")


def check_webhook_url(url: str, *, allowed_hosts: Sequence[str], what: str, resolve: Resolver = _resolve) -> None:
    """A webhook target: ``http`` or ``https``, a host, no credentials, and :func:`check_outbound_url`.

    Checked when the URL is given and again before each delivery (a name may resolve elsewhere later).
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise OutboundUrlRefusedError(f"{what} {url[:200]!r} is not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OutboundUrlRefusedError(f"{what} must be an http:// or https:// URL with a host, got {url[:200]!r}")
    if parts.username is not None or parts.password is not None:
        raise OutboundUrlRefusedError(f"{what} must not carry credentials; authenticate deliveries by their signature")
    if port == 0:
        raise OutboundUrlRefusedError(f"{what} {url[:200]!r} names port 0")
    check_outbound_url(url, allowed_hosts=allowed_hosts, what=what, resolve=resolve)
