"""Base-URL mode: agents that point a provider base URL at the gateway instead of going through it as a proxy.

The same listening port answers plain HTTP addressed to itself (docs/options.md#base-url-mode):

  http://127.0.0.1:P/anthropic           Anthropic Messages         → served as api.anthropic.com
  http://127.0.0.1:P/openai/v1           OpenAI Chat and Responses  → served as api.openai.com
  http://127.0.0.1:P/google              Google GenerateContent     → served as generativelanguage.googleapis.com

each optionally after `/s/<percent-encoded session>`. The call is then exactly a call to that provider host with the
path after the prefix: same codec, record (`host`, `path`; `connect` = "base_url") and guarantees.

Only for this machine (`admission`): the Host header must be the listen address (127.0.0.1:P, localhost:P, [::1]:P,
or the chosen listen host), a request carrying `Origin` is refused (a browser page must not write training records),
a body must be JSON, and no CORS header is ever sent. With a non-loopback listen host the mode is off unless
`polar_base_url=on`.

These are the rules; the paths are the provider calls' own: `divert.Divert` hands a connection whose first request
is origin-form (`POST /openai/v1/...`) to the gateway's endpoint below mitmproxy's HTTP layer, and what arrives
otherwise (an absolute-form request to our own address, a first segment too short to tell, polar_divert=false) is
served by `reroute.Reroute`'s request hook through the reroute token. Both end in `pending.from_base_url`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import unquote

from mitmproxy import ctx, http

from . import hosts as hostlist
from .provider_errors import error_answer

# family prefix → the provider host its calls are served as
FAMILIES = {"anthropic": "api.anthropic.com", "openai": "api.openai.com",
            "google": "generativelanguage.googleapis.com"}
SESSION_SEGMENT = "s"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
# An origin-form request line's start: the method, one space, a slash. Anything else (CONNECT, absolute-form, TLS,
# a first segment too short) is not diverted here.
ORIGIN_FORM = re.compile(rb"[A-Z]{3,7} /")


class BaseUrlRefused(ValueError):
    """A base-URL request this gateway does not serve: (kind, message) in the protocol's error shape."""

    def __init__(self, kind: str, message: str, protocol: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.protocol = protocol


@dataclass(frozen=True)
class Address:
    """Where a base-URL request goes: the provider host it is served as, the path after the prefix (query kept), and
    the session the path names (percent-decoded), if any."""

    host: str
    path: str
    session: str | None


def parse_target(target: str) -> Address:
    """`[/s/<session>]/<family>/<rest>` → Address; BaseUrlRefused (not_found, OpenAI's shape) for anything else."""
    raw = target if target.startswith("/") else "/"
    bare, sep, query = raw.partition("?")
    parts = bare.split("/")  # ['', 's', sid, family, ...] or ['', family, ...]
    session = None
    if len(parts) > 3 and parts[1] == SESSION_SEGMENT:
        session = unquote(parts[2], errors="strict") if parts[2] else ""
        if not session or not session.isprintable():
            raise BaseUrlRefused("bad_request", "the /s/<session>/ path prefix needs a printable session id")
        parts = ["", *parts[3:]]
    family = parts[1] if len(parts) > 1 else ""
    host = FAMILIES.get(family)
    if host is None:
        raise BaseUrlRefused("not_found", f"{bare[:200]} is not a base-URL address of this gateway: use "
                             "/anthropic, /openai/v1 or /google, optionally after /s/<session>")
    path = "/" + "/".join(parts[2:])
    return Address(host=host, path=path + (sep + query if sep else ""), session=session)


def allowed_hosts(listen_port: int, listen_host: str | None) -> frozenset[str]:
    """The Host values a base-URL request may carry: the loopback names and the chosen listen host, on the port the
    connection came in on."""
    names = set(LOOPBACK_NAMES)
    if listen_host and listen_host not in ("0.0.0.0", "::"):
        names.add(f"[{listen_host}]" if ":" in listen_host else listen_host.lower())
    return frozenset(f"{n}:{listen_port}" for n in names)


def admission(method: str, headers: list[tuple[str, str]], body: bytes, listen_port: int,
              listen_host: str | None) -> None:
    """BaseUrlRefused unless the request is for this machine: Host is the listen address, no Origin, a JSON body."""
    host = content_type = None
    for name, value in headers:
        lower = name.lower()
        if lower == "host" and host is None:
            host = value.strip().lower()
        elif lower == "origin":
            raise BaseUrlRefused("forbidden", "requests with an Origin header (a browser page) are refused in "
                                 "base-URL mode")
        elif lower == "content-type" and content_type is None:
            content_type = value
    if host not in allowed_hosts(listen_port, listen_host):
        raise BaseUrlRefused("forbidden", f"Host {host!r} is not this gateway's listen address "
                             f"(127.0.0.1:{listen_port}): base-URL mode serves this machine only")
    if body and not is_json_type(content_type):
        raise BaseUrlRefused("bad_request", f"content-type {content_type!r} refused: base-URL requests carry JSON "
                             "(application/json)")


def is_json_type(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def enabled(setting: str, listen_host: str | None) -> bool:
    """polar_base_url: on, off, or auto (on when the proxy listens on loopback only)."""
    if setting != "auto":
        return setting == "on"
    return is_loopback(listen_host)


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def refusal_answer(exc: BaseUrlRefused, address_host: str | None = None, path: str | None = None):
    """(status, content type, body) of a refused base-URL request, in its protocol's shape when the family is
    known (else OpenAI's)."""
    protocol = exc.protocol or (hostlist.protocol_for(address_host, path) if address_host else None)
    return error_answer(protocol, exc.kind, f"polar gateway: {exc}")


def listen_host() -> str | None:
    return getattr(ctx.options, "listen_host", None) if hasattr(ctx, "options") else None


def own_address_port(flow: http.HTTPFlow, tunnelled: bool, origin_form: bool) -> int | None:
    """The listen port when a plain-HTTP request reaching the request hook is a base-URL request: on a connection
    that opened with an origin-form request (`origin_form`, seen by divert.Divert in its first bytes) whatever its
    Host says (admission checks it, so a Host naming another server is refused, never forwarded there), or
    absolute-form to the gateway's own address (loopback or the listen host, this connection's port). None for
    anything else (proxy requests to other hosts, tunnelled traffic).

    mitmproxy clears the authority of every regular-mode HTTP/1 request before the hooks, so the two forms look
    alike here: the connection's first bytes tell them apart."""
    client, req = flow.client_conn, flow.request
    if tunnelled or client.tls or req.scheme != "http" or not client.sockname:
        return None
    port = int(client.sockname[1])
    if origin_form:
        return port  # addressed to whoever listens here, i.e. us
    if req.port != port:
        return None
    name = req.host.lower().strip("[]")
    lh = listen_host()
    return port if name in ("127.0.0.1", "localhost", "::1") or (lh and name == lh.lower().strip("[]")) else None
