"""Which hosts are providers (decrypted and answered by the gateway). Standard library only: the fail-closed path in
polar_addon.py loads this file by path when the package itself cannot be imported."""

from __future__ import annotations

# FIELD-NOTES §3: every host a target agent sends model calls to.
DEFAULT_HOSTS = (
    "api.anthropic.com",
    "api.openai.com",
    "chatgpt.com",
    "generativelanguage.googleapis.com",
    "dashscope.aliyuncs.com",
    "dashscope-intl.aliyuncs.com",
)


def parse_hosts(entries) -> frozenset[tuple[str, int]]:
    """Exact (host, port) pairs from option entries `host` or `host:port` (port 443 when absent)."""
    out = set()
    for entry in entries:
        entry = str(entry).strip().lower()
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        if sep and port.isdigit() and host and "]" not in port:
            out.add((host.strip("[]"), int(port)))
        else:
            out.add((entry, 443))
    return frozenset(out)


def is_provider(hosts: frozenset[tuple[str, int]], host: str | None, port: int | None) -> bool:
    """Exact, case-insensitive match; never a substring or suffix match (a look-alike host is not a provider)."""
    if not host:
        return False
    return (host.lower().rstrip("."), int(port or 443)) in hosts
