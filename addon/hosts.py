"""Which hosts are providers (decrypted and answered by the gateway), and which protocol each speaks. Standard library
only: the fail-closed path in polar_addon.py loads this file by path when the package itself cannot be imported."""

from __future__ import annotations

# Every host a target agent sends model calls to (docs/field-notes.md: the agent CLIs).
DEFAULT_HOSTS = (
    "api.anthropic.com",
    "api.openai.com",
    "chatgpt.com",
    "generativelanguage.googleapis.com",
    "dashscope.aliyuncs.com",
    "dashscope-intl.aliyuncs.com",
)

# The protocol each default host speaks; api.openai.com serves two, told apart by path (RESPONSES_PATH_PREFIX).
HOST_PROTOCOLS = {
    "api.anthropic.com": "anthropic_messages",
    "api.openai.com": "openai_chat",
    "chatgpt.com": "openai_responses",
    "generativelanguage.googleapis.com": "google_generate",
    "dashscope.aliyuncs.com": "openai_chat",
    "dashscope-intl.aliyuncs.com": "openai_chat",
}
RESPONSES_PATH_PREFIX = "/v1/responses"


def host_name(host: str | None) -> str:
    """The bare host name of a Host value: stripped, lower case, any port and a trailing dot dropped (a bracketed
    IPv6 literal is kept whole). The one rule for routing by host name: protocol_for below and every codec's route."""
    name = (host or "").strip().lower()
    return name if name.startswith("[") else name.split(":", 1)[0].rstrip(".")


def protocol_for(host: str | None, path: str | None) -> str | None:
    """The protocol a request to a provider host speaks, from the exact host name (any port) and, on api.openai.com,
    the path; None for a host no codec serves (a host added through polar_hosts that is not a known provider)."""
    name = host_name(host)
    bare = (path or "/").split("?", 1)[0]
    if name == "api.openai.com" and (bare == RESPONSES_PATH_PREFIX or bare.startswith(RESPONSES_PATH_PREFIX + "/")):
        return "openai_responses"
    return HOST_PROTOCOLS.get(name)


def parse_host_entry(entry) -> tuple[str, int]:
    """One polar_hosts entry, `host` or `host:port` (port 443 when absent) → (host, port); ValueError if malformed."""
    text = str(entry).strip().lower()
    if not text:
        raise ValueError("empty host entry")
    host, port = text, 443
    if text.startswith("["):  # [v6] or [v6]:port
        inner, _, rest = text[1:].partition("]")
        host = inner
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"bad host entry {entry!r}")
            port = _port(rest[1:], entry)
    elif text.count(":") == 1:
        host, _, raw = text.partition(":")
        port = _port(raw, entry)
    host = host.rstrip(".")
    if not host or any(c.isspace() or c in "/@?#" for c in host):
        raise ValueError(f"bad host entry {entry!r} (use host or host:port)")
    return host, port


def _port(raw: str, entry) -> int:
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ValueError(f"bad port in host entry {entry!r} (1-65535)")
    return int(raw)


def parse_hosts(entries, *, strict: bool = True) -> frozenset[tuple[str, int]]:
    """Exact (host, port) pairs from option entries. strict: a malformed entry raises ValueError; otherwise it is
    skipped (the fail-closed path decrypts what it can rather than fail)."""
    out = set()
    for entry in entries:
        if not str(entry).strip():
            continue
        try:
            out.add(parse_host_entry(entry))
        except ValueError:
            if strict:
                raise
    return frozenset(out)


def fail_closed_hosts(entries) -> frozenset[tuple[str, int]]:
    """What a failed gateway decrypts: the default providers plus every entry that parses, so that a bad polar_hosts
    value can only widen what is answered with 503, never let a provider's TLS through untouched."""
    return parse_hosts(DEFAULT_HOSTS) | parse_hosts(entries or (), strict=False)


def is_provider(hosts: frozenset[tuple[str, int]], host: str | None, port: int | None) -> bool:
    """Exact, case-insensitive match; never a substring or suffix match (a look-alike host is not a provider)."""
    if not host:
        return False
    return (host.lower().rstrip(".").strip("[]"), int(port or 443)) in hosts
