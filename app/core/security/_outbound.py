"""The guard on every URL the service itself connects to: the S3 endpoint, the model hub and webhook receivers.

A server that fetches from a configurable address can be turned against its own network (SSRF):
the cloud metadata service at 169.254.169.254 hands out credentials, and services bound to
loopback trust their callers. So an outbound URL whose host is, or resolves to, a loopback,
link-local, unspecified, multicast, broadcast, reserved or metadata address is refused unless the
operator lists that host in ``CAHP_ALLOWED_OUTBOUND_HOSTS`` (a local MinIO on 127.0.0.1, for
example). Every address a name resolves to is checked, so odd spellings (``0x7f000001``,
``[::ffff:127.0.0.1]``, an IPv4 address inside a NAT64 or 6to4 one) and names that point at such
addresses are caught too.

Webhook receivers are chosen by any API key holder, not by the operator, so they are held to more
(:func:`check_webhook_url`, ``receiver=True``): private networks (10/8, 172.16/12, 192.168/16,
fc00::/7), shared address space (100.64/10), the documentation and benchmarking ranges, IPv6 outside
global unicast, and this machine's own interface addresses are refused as well, unless allowed the
same way. The S3 endpoint and the hub are the operator's choice, and private networks are where
self-hosted S3 usually lives, so those stay open to them.

A URL check resolves the name when it runs; a connection made afterwards resolves it again, and a
DNS answer that changed in between (rebinding) is outside what a URL check can see. So the webhook
dispatcher checks the address it actually connects to, with :func:`check_address`, in the network
backend of its HTTP client (:mod:`app.api.background._webhook_http`).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from app.core.errors import OutboundUrlRefusedError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Networks never reached without an explicit allowance, with what they are; the first match names it.
REFUSED_NETWORKS = tuple((ipaddress.ip_network(n), kind) for n, kind in (
    ("127.0.0.0/8", "loopback"), ("::1/128", "loopback"),
    # Link-local holds the cloud metadata service (169.254.169.254) on AWS, GCP and Azure.
    ("169.254.0.0/16", "link-local"), ("fe80::/10", "link-local"),
    ("0.0.0.0/8", "unspecified"), ("::/128", "unspecified"),
    ("fd00:ec2::254/128", "cloud metadata"),    # AWS over IPv6
    ("100.100.100.200/32", "cloud metadata"),   # Alibaba Cloud
    ("192.0.0.192/32", "cloud metadata"),       # Oracle Cloud
    ("224.0.0.0/4", "multicast"), ("ff00::/8", "multicast"),
    ("255.255.255.255/32", "broadcast"), ("240.0.0.0/4", "reserved"),
))
#: Also refused for webhook receivers (see the module docstring), after :data:`REFUSED_NETWORKS`.
RECEIVER_REFUSED_NETWORKS = tuple((ipaddress.ip_network(n), kind) for n, kind in (
    ("10.0.0.0/8", "private"), ("172.16.0.0/12", "private"), ("192.168.0.0/16", "private"),
    ("fc00::/7", "private"), ("fec0::/10", "private"),
    ("100.64.0.0/10", "shared (carrier-grade NAT)"),
    ("192.0.0.0/24", "reserved"), ("2001::/23", "reserved"),
    ("192.0.2.0/24", "documentation"), ("198.51.100.0/24", "documentation"), ("203.0.113.0/24", "documentation"),
    ("2001:db8::/32", "documentation"), ("3fff::/20", "documentation"),
    ("198.18.0.0/15", "benchmarking"),
))
#: The only IPv6 addresses in use on the Internet (RFC 4291); a receiver anywhere else is refused.
GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
#: NAT64's well-known prefix (RFC 6052): the last 32 bits are the IPv4 address reached.
NAT64 = ipaddress.ip_network("64:ff9b::/96")
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
    """The address ``text`` names, with an IPv4 address carried inside an IPv6 one taken out."""
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone index
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address in NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def interface_addresses() -> frozenset[IPAddress]:
    """The addresses of this machine's network interfaces (read at each call: they can change)."""
    import psutil

    found: set[IPAddress] = set()
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                address = _address(entry.address)
                if address is not None:
                    found.add(address)
    return frozenset(found)


def refused_kind(address: IPAddress, *, receiver: bool = False) -> str | None:
    """What ``address`` is, when that keeps it from being reached without an allowance; else None.

    ``receiver`` applies the webhook receivers' stricter rules (see the module docstring).
    """
    networks = REFUSED_NETWORKS + RECEIVER_REFUSED_NETWORKS if receiver else REFUSED_NETWORKS
    for network, kind in networks:
        if address.version == network.version and address in network:
            return kind
    if receiver:
        if isinstance(address, ipaddress.IPv6Address) and address not in GLOBAL_UNICAST_V6:
            return "reserved"
        if address in interface_addresses():
            return OWN
    return None


#: The kind of an address of this machine's own interfaces.
OWN = "own"


def _phrase(kind: str) -> str:
    """``"loopback"`` -> ``"a loopback address"``, as the messages say it."""
    if kind == OWN:
        return "an address of this server"
    return ("an " if kind[0] in "aeiou" else "a ") + kind + " address"


def refused_reason(address: IPAddress, *, receiver: bool = False) -> str | None:
    """Why ``address`` may not be reached without an allowance, or None when it may."""
    kind = refused_kind(address, receiver=receiver)
    return None if kind is None else f"{address} is {_phrase(kind)}"


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


def _refusal(what: str, url: str, host: str, reason: str, *, receiver: bool) -> OutboundUrlRefusedError:
    if receiver:
        return OutboundUrlRefusedError(
            f"{what} {url[:200]!r} is refused: {reason}, which webhooks are not sent to; give a receiver on "
            f"a public address, or ask the operator to add {host!r} to CAHP_ALLOWED_OUTBOUND_HOSTS"
        )
    return OutboundUrlRefusedError(
        f"{what} {url!r} is refused: {reason}, which this server does not connect to; if that is "
        f"really intended (e.g. a local MinIO), add {host!r} to CAHP_ALLOWED_OUTBOUND_HOSTS"
    )


def _host(url: str, what: str) -> str:
    try:
        host = (urlsplit(url).hostname or "").rstrip(".").lower()
    except ValueError as exc:
        raise OutboundUrlRefusedError(f"{what} {url!r} is not a valid URL: {exc}") from exc
    if not host:
        raise OutboundUrlRefusedError(f"{what} {url!r} has no host")
    return host


def check_outbound_url(url: str, *, allowed_hosts: Sequence[str], what: str, resolve: Resolver = _resolve,
                       receiver: bool = False) -> None:
    """Refuse ``url`` if it leads to an address in a refused class that is not allowed.

    Parameters
    ----------
    url : the URL the service is about to connect to
    allowed_hosts : ``CAHP_ALLOWED_OUTBOUND_HOSTS``: names, addresses or CIDR networks
    what : what the URL is for, e.g. ``"CAHP_S3_ENDPOINT_URL"``, to name it in the message
    receiver : apply the stricter rules of webhook receivers; their messages then name the kind of
        address a name resolves to but not the address, so a key holder cannot map internal names

    Raises
    ------
    OutboundUrlRefusedError
        With the address (or its kind) found and the setting that would allow it.
    """
    host = _host(url, what)
    literal = _address(host)
    candidates = [literal] if literal is not None else [a for a in map(_address, resolve(host)) if a is not None]
    if _allowed(host, candidates, allowed_hosts):
        return
    if host in REFUSED_NAMES:
        raise _refusal(what, url, host, f"{host} is a cloud metadata service", receiver=receiver)
    for address in candidates:
        kind = refused_kind(address, receiver=receiver)
        if kind is None:
            continue
        if literal is None and receiver:
            reason = f"{host} resolves to {_phrase(kind)}"
        elif literal is None:
            reason = f"{host} resolves to {address}, {_phrase(kind)}"
        else:
            reason = f"{address} is {_phrase(kind)}"
        raise _refusal(what, url, host, reason, receiver=receiver)


def check_address(host: str, address: str, *, allowed_hosts: Sequence[str]) -> None:
    """Refuse to connect a webhook delivery for ``host`` to ``address`` (one answer of its DNS lookup).

    The check at the moment of connecting, on the address connected to: a name that resolved to a
    public address when its URL was checked and resolves to an internal one now is caught here.
    """
    name = host.rstrip(".").lower()
    found = _address(address)
    if found is None or _allowed(name, [found], allowed_hosts):
        return
    kind = refused_kind(found, receiver=True)
    if kind is None:
        return
    reason = f"{found} is {_phrase(kind)}" if _address(name) is not None else f"{name} resolves to {_phrase(kind)}"
    raise OutboundUrlRefusedError(f"the webhook receiver is refused: {reason}, which webhooks are not sent to; "
                                  f"ask the operator to add {name!r} to CAHP_ALLOWED_OUTBOUND_HOSTS if intended")


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


def _unprintable(text: str) -> tuple[int, str] | None:
    """The first whitespace or control (or other invisible, Unicode category C) character, with its index."""
    for index, char in enumerate(text):
        if char.isspace() or unicodedata.category(char).startswith("C"):
            return index, char
    return None


def check_webhook_url(url: str, *, allowed_hosts: Sequence[str], what: str, resolve: Resolver = _resolve) -> None:
    """A webhook target: ``http`` or ``https``, a host, no credentials, no whitespace or control
    characters, and :func:`check_outbound_url` with the receivers' rules.

    Checked when the URL is given and again before each delivery; the dispatcher also checks the
    address it connects to (:func:`check_address`).
    """
    found = _unprintable(url)
    if found is not None:
        index, char = found
        raise OutboundUrlRefusedError(
            f"{what} must not contain whitespace or control characters: found {char!r} at position {index}; "
            f"remove it, or percent-encode it (e.g. {''.join(f'%{b:02X}' for b in char.encode())})"
        )
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
    check_outbound_url(url, allowed_hosts=allowed_hosts, what=what, resolve=resolve, receiver=True)


#: ``scheme://user:password@`` (or ``scheme://token@``) inside any text: the userinfo part of a URL.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^\s/?#@'\"<>]+@")


def hide_credentials(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``.

    An operator's address may carry a user and password (``https://user:secret@mlflow.internal``); it
    appears in what a caller reads (a registration's ``tracking_uri``, an error that quotes the
    address, a log line) only as ``https://***@mlflow.internal``.
    """
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}***@", text)
