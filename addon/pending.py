"""The one way a provider request becomes a `PendingCall`, whichever path brought it.

`pending_call` does the work both paths share (the path without `key=`, the session from the proxy credentials when
the connection named none, the body decoded per Content-Encoding); `from_flow` and `from_request` only read their
inputs, from mitmproxy's parsed request (the request-hook reroute) or from the raw request the endpoint read from a
diverted tunnel; `from_base_url` reads a base-URL request (addon/base_url.py) from either path.
"""

from __future__ import annotations

import time

from mitmproxy import http
from mitmproxy.net import encoding
from mitmproxy.net.http import url

from polar.records import uuid7

from . import base_url, sessions
from . import hosts as hostlist
from .call import PendingCall, strip_key_param
from .endpoint import Request


def pending_call(*, conn_id: str, conn_user: str | None, proxy_auth: str | None, host: str, method: str,
                 raw_path: str, headers: list[tuple[str, str]], body: bytes,
                 content_encoding: str | None, too_large: bool = False) -> PendingCall:
    """A call as the endpoint serves it. `too_large`: the body is refused on its size, so it is never decoded."""
    path, _ = strip_key_param(raw_path)
    if conn_user is None:
        conn_user = sessions.proxy_user(proxy_auth)  # plain-HTTP proxy requests, or credentials on the request
    pending = PendingCall(
        record_id=uuid7(), conn_id=conn_id, host=host.lower(), method=method, path=path, headers=headers, body=body,
        conn_user=conn_user, t_start=time.time(),
    )
    if content_encoding and not too_large:
        try:
            decoded = encoding.decode(body, content_encoding)
            if isinstance(decoded, str):  # a text codec named as a content encoding (mitmproxy refuses it too)
                raise ValueError(f"Invalid Content-Encoding: {content_encoding}")
            pending.body = decoded or b""
        except ValueError:
            pending.decode_error = f"cannot decode content-encoding {content_encoding!r}"
    return pending


def from_flow(flow: http.HTTPFlow, conn_user: str | None) -> PendingCall:
    """A provider flow the request hook reroutes: mitmproxy's parsed request as it came."""
    req = flow.request
    return pending_call(
        conn_id=flow.client_conn.id, conn_user=conn_user, proxy_auth=req.headers.get("proxy-authorization"),
        host=req.pretty_host, method=req.method, raw_path=req.path,
        headers=list(req.headers.items(multi=True)), body=req.raw_content or b"",
        content_encoding=req.headers.get("content-encoding"),
    )


def from_request(request: Request) -> PendingCall:
    """The agent's own request from a diverted tunnel, read as mitmproxy would have parsed it: headers as sent
    (minus an `Expect: 100-continue` the endpoint answered, as mitmproxy drops it), host from the Host header (else
    the CONNECT host) and the CONNECT port, an absolute-form target made a path."""
    h = request.handoff
    headers: list[tuple[str, str]] = []
    host_header = proxy_auth = None
    encodings: list[str] = []
    for raw_name, raw_value in request.headers:  # one pass: the call's only per-header work on this path
        name, value = raw_name.decode("utf-8", "surrogateescape"), raw_value.decode("utf-8", "surrogateescape")
        lower = name.lower()
        if lower == "expect" and value.lower() == "100-continue":
            continue
        if lower == "host" and host_header is None:
            host_header = value
        elif lower == "content-encoding":
            encodings.append(value)
        elif lower == "proxy-authorization" and proxy_auth is None:
            proxy_auth = value
        headers.append((name, value))
    host = url.parse_authority(host_header, check=False)[0] if host_header else h.host
    raw_path = request.target
    if not raw_path.startswith("/") and "://" in raw_path:  # absolute-form inside the tunnel
        rest = raw_path.split("://", 1)[1]
        raw_path = "/" + rest.split("/", 1)[1] if "/" in rest else "/"
    return pending_call(
        conn_id=h.conn_id, conn_user=h.conn_user, proxy_auth=proxy_auth, host=host, method=request.method,
        raw_path=raw_path, headers=headers, body=request.body,
        content_encoding=", ".join(encodings) if encodings else None, too_large=request.too_large,
    )


def from_base_url(*, conn_id: str, listen_port: int, method: str, target: str, headers: list[tuple[str, str]],
                  body: bytes, content_encoding: str | None, conn_user: str | None = None,
                  listen_host: str | None = None, too_large: bool = False) -> PendingCall:
    """A base-URL request (plain HTTP to the gateway's own address) as the call to the provider host its prefix
    names; `base_url.BaseUrlRefused` when it is not for this machine, names no family, or its path session
    disagrees with the proxy credentials the sandbox relay stamped (a sample naming another's session)."""
    address = base_url.parse_target(target)
    protocol = hostlist.protocol_for(address.host, address.path)
    try:
        base_url.admission(method, headers, body, listen_port,
                           listen_host if listen_host is not None else base_url.listen_host())
    except base_url.BaseUrlRefused as exc:
        exc.protocol = protocol
        raise
    proxy_auth = next((v for k, v in headers if k.lower() == "proxy-authorization"), None)
    pending = pending_call(conn_id=conn_id, conn_user=conn_user, proxy_auth=proxy_auth, host=address.host,
                           method=method, raw_path=address.path, headers=headers, body=body,
                           content_encoding=content_encoding, too_large=too_large)
    if address.session is not None and pending.conn_user and address.session != pending.conn_user:
        raise base_url.BaseUrlRefused(
            "bad_request", f"the path names session {address.session!r} but this connection's proxy credentials "
                           f"name {pending.conn_user!r}", protocol)
    pending.connect = "base_url"
    pending.path_session = address.session
    return pending


def from_base_url_request(request: Request) -> PendingCall:
    """A request read from a diverted base-URL connection (headers as sent, minus an answered `Expect`)."""
    h = request.handoff
    headers: list[tuple[str, str]] = []
    encodings: list[str] = []
    for raw_name, raw_value in request.headers:
        name, value = raw_name.decode("utf-8", "surrogateescape"), raw_value.decode("utf-8", "surrogateescape")
        lower = name.lower()
        if lower == "expect" and value.lower() == "100-continue":
            continue
        if lower == "content-encoding":
            encodings.append(value)
        headers.append((name, value))
    return from_base_url(conn_id=h.conn_id, listen_port=h.listen_port, method=request.method, target=request.target,
                         headers=headers, body=request.body, content_encoding=", ".join(encodings) or None,
                         conn_user=h.conn_user, too_large=request.too_large)
