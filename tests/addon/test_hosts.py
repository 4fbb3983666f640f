"""Host routing (no sockets): exact provider matching, and the protocol each host speaks — the fail-closed path's
routing must agree with the codecs' own (it runs when the codecs cannot be imported)."""

from __future__ import annotations

import pytest

from polar.addon import hosts
from polar.addon.codecs import find_route

pytestmark = pytest.mark.unit

GENERATE = [  # host, path of each protocol's generation call
    ("api.anthropic.com", "/v1/messages"), ("api.anthropic.com", "/v1/messages/count_tokens"),
    ("api.openai.com", "/v1/chat/completions"), ("api.openai.com", "/v1/responses"),
    ("api.openai.com", "/v1/responses/input_tokens"), ("chatgpt.com", "/backend-api/codex/responses"),
    ("dashscope.aliyuncs.com", "/compatible-mode/v1/chat/completions"),
    ("dashscope-intl.aliyuncs.com", "/compatible-mode/v1/chat/completions"),
    ("generativelanguage.googleapis.com", "/v1beta/models/gemini:streamGenerateContent?alt=sse"),
]


@pytest.mark.parametrize("host,path", GENERATE)
def test_1_1_protocol_for_agrees_with_the_codecs(host, path):
    codec, route = find_route("POST", host, path, [])
    assert hosts.protocol_for(host, path) == route.protocol == codec.PROTOCOL
    assert hosts.protocol_for(f"{host.upper()}:8443", path) == route.protocol  # any port: polar_hosts may add one


def test_1_2_every_default_host_has_a_protocol_and_unknown_hosts_none():
    assert set(hosts.DEFAULT_HOSTS) == set(hosts.HOST_PROTOCOLS)
    assert hosts.protocol_for("api.anthropic.com.evil.test", "/v1/messages") is None
    assert hosts.protocol_for("my-llm.internal", "/v1/chat/completions") is None


def test_2_1_entries_parse_exactly_and_malformed_ones_are_refused():
    assert hosts.parse_hosts(["API.OpenAI.com", "h:8443", "[::1]:9", "[::1]"]) == {
        ("api.openai.com", 443), ("h", 8443), ("::1", 9), ("::1", 443)}
    for bad in ("h:0", "h:65536", "h:x", "a b", "user@h", "[::1]x"):
        with pytest.raises(ValueError):
            hosts.parse_hosts([bad])
    assert hosts.parse_hosts(["h:x", "ok.com"], strict=False) == {("ok.com", 443)}


def test_2_2_a_failed_gateway_only_ever_widens_what_it_answers():
    wide = hosts.fail_closed_hosts(["h:x", "stand.in:9443"])
    assert hosts.parse_hosts(hosts.DEFAULT_HOSTS) <= wide and ("stand.in", 9443) in wide
    assert hosts.is_provider(wide, "API.ANTHROPIC.COM.", 443) and not hosts.is_provider(wide, "example.com", 443)
