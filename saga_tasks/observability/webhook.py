"""The alert webhook's reach: where it may point, and a POST that goes there and nowhere else.

An orchestrator sits next to services that trust a caller on the same host or network
(RabbitMQ's management API, PostgreSQL, a cloud's metadata endpoint at 169.254.169.254).
A webhook URL that names one of them, a name that resolves to one, or a webhook that
redirects there would make the alerter their client. So the URL may carry no
credentials (they would be in every line that names it); its host, and every address it
resolves to, may be neither loopback, link-local nor unspecified, unless
``SAGA_ALERT_WEBHOOK_ALLOW_LOCAL`` allows the first two (a webhook server beside the
orchestrator, the tests'); the POST connects to an address so checked (a name resolved
again cannot move it), follows no redirect (a redirect is a failed delivery) and uses no
HTTP proxy. A private network address is allowed: that is where a pager usually lives.

Imports nothing of saga_tasks but errors, so the settings check the URL as they load.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import ssl
from urllib.parse import SplitResult, urlsplit

from saga_tasks.errors import ServiceUnavailable, WebhookRefused

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

METADATA = frozenset({ipaddress.ip_address("fd00:ec2::254")})
"""Cloud metadata endpoints outside the link-local range (EC2's IPv6 one)."""
MAX_RESPONSE = 65536
"""Bytes of a webhook's answer read before the connection is closed."""
SERVICE = "the alert webhook"


def address_refusal(address: IPAddress, *, allow_local: bool) -> str | None:
    """Why the alerter may not connect to ``address``; None if it may."""
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    if mapped is not None:
        return address_refusal(mapped, allow_local=allow_local)
    if address.is_unspecified:
        return "the unspecified address (this host)"
    if address in METADATA:
        return "a cloud metadata endpoint"
    if address.is_loopback and not allow_local:
        return "a loopback address (this host)"
    if address.is_link_local and not allow_local:
        return "a link-local address (a cloud metadata endpoint lives there)"
    if address.is_multicast:
        return "a multicast address"
    return None


def check_url(url: str, *, allow_local: bool, resolve: bool) -> SplitResult:
    """The URL split, once it is an http(s) URL with a host and no credentials whose host
    is no refused address; with ``resolve``, every address the host resolves to is
    checked too (a name that does not resolve now passes: each POST checks again).
    ``WebhookRefused`` otherwise."""
    split = urlsplit(url)
    host = split.hostname
    if split.scheme not in ("http", "https") or not host:
        raise WebhookRefused("must be an http(s) URL with a host")
    if "@" in split.netloc:
        raise WebhookRefused(
            "must not carry credentials (user:password@): they would show wherever the URL "
            "does; put a token in its path or query instead"
        )
    _port(split)
    literal = _literal(host)
    if literal is not None:
        why = address_refusal(literal, allow_local=allow_local)
        if why is not None:
            raise WebhookRefused(_refused(host, literal, why))
    elif resolve:
        with contextlib.suppress(OSError):  # not resolvable now: each POST checks again
            addresses(split, allow_local=allow_local)
    return split


def addresses(split: SplitResult, *, allow_local: bool) -> list[IPAddress]:
    """Every address the URL's host resolves to; ``WebhookRefused`` if any is refused
    (a name that answers with one good and one bad address is refused whole)."""
    host = split.hostname or ""
    found: list[IPAddress] = []
    for *_rest, sockaddr in socket.getaddrinfo(host, _port(split), type=socket.SOCK_STREAM):
        address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        why = address_refusal(address, allow_local=allow_local)
        if why is not None:
            raise WebhookRefused(_refused(host, address, why))
        if address not in found:
            found.append(address)
    if not found:
        raise OSError(f"{host} resolves to no address")
    return found


def post(url: str, body: bytes, *, timeout: float, allow_local: bool) -> int:
    """POST ``body`` as JSON to the webhook, at an address checked as above; its status.

    ``WebhookRefused`` for a refused URL or address; ``ServiceUnavailable`` when the
    webhook cannot be reached or answers anything but 2xx (a 3xx names where it pointed,
    by scheme and host only: a redirect is a failed delivery, never followed)."""
    split = check_url(url, allow_local=allow_local, resolve=False)
    host, port = split.hostname or "", _port(split)
    where = f"{split.scheme}://{host}:{port}"
    target = (split.path or "/") + (f"?{split.query}" if split.query else "")
    try:
        address = str(addresses(split, allow_local=allow_local)[0])
        connection: http.client.HTTPConnection = (
            _PinnedTLS(host, port, address, timeout)
            if split.scheme == "https"
            else _Pinned(host, port, address, timeout)
        )
        try:
            connection.request(
                "POST",
                target,
                body=body,
                headers={"Content-Type": "application/json", "User-Agent": "saga_tasks"},
            )
            response = connection.getresponse()
            response.read(MAX_RESPONSE)
            status, location = response.status, response.getheader("Location") or ""
        finally:
            connection.close()
    except (OSError, http.client.HTTPException) as exc:
        detail = str(exc).strip().splitlines()
        raise ServiceUnavailable(
            SERVICE, where, (detail[0] if detail else type(exc).__name__)[:300]
        ) from exc
    if 300 <= status < 400:
        moved = urlsplit(location)
        to = f" to {moved.scheme}://{moved.hostname}" if moved.hostname else ""
        raise ServiceUnavailable(SERVICE, where, f"answered {status}, a redirect{to}: not followed")
    if not 200 <= status < 300:
        raise ServiceUnavailable(SERVICE, where, f"answered {status}")
    return status


def _port(split: SplitResult) -> int:
    try:
        port = split.port
    except ValueError:
        raise WebhookRefused("has a port that is not a number from 0 to 65535") from None
    return port or (443 if split.scheme == "https" else 80)


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return None


def _refused(host: str, address: IPAddress, why: str) -> str:
    named = host if host == str(address) else f"{host} ({address})"
    lifted = address_refusal(address, allow_local=True) is None
    return f"points at {named}, {why}: no alert goes to this host's services" + (
        "; SAGA_ALERT_WEBHOOK_ALLOW_LOCAL=1 allows loopback and link-local addresses"
        if lifted
        else ""
    )


class _Pinned(http.client.HTTPConnection):
    """An HTTP connection to ``address``, naming ``host`` in its Host header."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedTLS(http.client.HTTPSConnection):
    """An HTTPS connection to ``address``, its certificate checked against ``host``."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self._tls)
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self.host)
