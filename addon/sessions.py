"""Session attribution (docs/records.md#fields, `session_source`): proxy credentials user name, then a base-URL
path prefix (`/s/<session>/`), then header `x-polar-session`, then the harness's own key (found by the protocol
codec), else null. A session id is never invented."""

from __future__ import annotations

import base64
import binascii
from urllib.parse import unquote

SESSION_HEADER = "x-polar-session"


def proxy_user(proxy_authorization: str | None) -> str | None:
    """The percent-decoded user name of a `Basic` Proxy-Authorization value, or None."""
    if not proxy_authorization:
        return None
    scheme, _, token = proxy_authorization.strip().partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return None
    # Clients percent-decode the URL's user name before building this header, so a session may contain ':'; the
    # password is ours (always `x`) and never does: split at the last colon.
    user, sep, _ = decoded.rpartition(":")
    return unquote(user if sep else decoded) or None


def resolve(conn_user: str | None, headers: list[tuple[str, str]], harness_key,
            path_session: str | None = None) -> tuple[str | None, str]:
    """(session, session_source) in priority order."""
    if conn_user:
        return conn_user, "proxy_auth"
    if path_session:
        return path_session, "path"
    for name, value in headers:
        if name.lower() == SESSION_HEADER and value.strip():
            return value.strip(), SESSION_HEADER
    if harness_key is not None and harness_key.value:
        return harness_key.value, harness_key.source
    return None, "none"
