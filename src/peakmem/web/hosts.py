"""The Host header check of ``peakmem serve``: a guard against DNS rebinding.

A page on another site can make a browser's name for it resolve to 127.0.0.1 and then call the local
server as "its own" origin; the browser still sends that site's name in ``Host``. So the server
answers only requests whose ``Host`` names it: ``127.0.0.1``, ``localhost``, ``[::1]``, the address it
binds, and the names given with ``peakmem serve --allow-host NAME``, each bare or with the bound port;
any other is answered 400 with how to serve it. (The same guard as Jupyter's ``allow_remote_access``
and webpack-dev-server's ``allowedHosts``.) Pure ASGI, no FastAPI import.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")
ALLOW_HOST_FLAG = "--allow-host"
MAX_SHOWN_HOST = 100  # an error quotes at most this much of a Host header

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def host_name(host: str) -> str:
    """A host as a Host header writes it: lower case, an IPv6 address in brackets."""
    host = host.strip().lower()
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def allowed_hosts(bound: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The names the server at ``bound`` answers to."""
    return frozenset(host_name(h) for h in (*LOCAL_HOSTS, bound, *extra))


def split_host(header: str) -> tuple[str, int | None]:
    """``name[:port]`` or ``[v6][:port]`` -> (name, port); a port that is not a number is -1."""
    if header.startswith("[") and "]" in header:
        name, _, rest = header.partition("]")
        name, port = name + "]", rest[1:] if rest.startswith(":") else (rest or None)
    elif header.count(":") == 1:
        name, port = header.split(":")
    else:
        name, port = header, None
    if port is None:
        return name.lower(), None
    return name.lower(), int(port) if port.isdigit() else -1


def host_refusal(header: str | None, allowed: frozenset[str], port: int) -> str | None:
    """Why ``header`` is refused (None: it names this server)."""
    if header is not None:
        name, got_port = split_host(header)
        if name in allowed and got_port in (None, port):
            return None
    shown = "no Host header" if header is None else f"Host {header[:MAX_SHOWN_HOST]!r}"
    names = ", ".join(sorted(allowed))
    return (f"{shown} is not this server (it answers to {names} on port {port}, a guard against "
            f"DNS rebinding); to serve another host name, start it with "
            f"`peakmem serve {ALLOW_HOST_FLAG} NAME`")  # fmt: skip


async def send_error(send: Send, status: int, loc: list[str], message: str, kind: str) -> None:
    """An error answer sent before the application runs: the API's JSON error shape (``error``,
    ``field``, ``detail``), and the connection closed."""
    detail = [{"loc": loc, "msg": message, "type": kind}]
    body = json.dumps({"error": message, "field": loc[-1], "detail": detail}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


class HostCheck:
    """ASGI middleware: a request whose Host header does not name this server is answered 400."""

    def __init__(
        self, app: Callable[[Scope, Receive, Send], Awaitable[None]], allowed: frozenset[str], port: int
    ) -> None:
        self.app, self.allowed, self.port = app, allowed, port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        raw = dict(scope.get("headers") or ()).get(b"host")
        header = raw.decode("latin-1") if raw is not None else None
        why = host_refusal(header, self.allowed, self.port)
        if why is None:
            await self.app(scope, receive, send)
            return
        await send_error(send, 400, ["header", "host"], why, "host")
