"""Option parsing (no sockets): every option's good default parses, every bad value is one line naming the option;
mitmproxy's deferred `--set` values that its own parser would reject are taken out before they abort the load.

Scenarios: 1.x parse_options · 2.x sampling override · 3.x take_unparseable on a real OptManager.
"""

from __future__ import annotations

import pytest
from mitmproxy import optmanager

from polar.addon.options import OPTIONS, OptionError, parse_options, parse_sampling_override, take_unparseable

pytestmark = pytest.mark.unit

DEFAULTS = {o.name: o.default for o in OPTIONS}


def test_1_1_the_defaults_parse():
    o = parse_options(DEFAULTS)
    assert o.upstream.endswith("/v1") and o.exact is False and o.max_body_bytes == 32 << 20
    assert ("api.anthropic.com", 443) in o.hosts and o.min_free_mb == 512


@pytest.mark.parametrize("name,value", [
    ("polar_upstream", "http://h:1"), ("polar_upstream", "h:1/v1"), ("polar_upstream", "ftp://h/v1"),
    ("polar_flows", " "), ("polar_model", ""), ("polar_hosts", []), ("polar_hosts", ["a.com:0"]),
    ("polar_hosts", ["a.com:x"]), ("polar_hosts", ["a b"]), ("polar_backend", "vlm"),
    ("polar_upstream_api_key", "a b"), ("polar_upstream_api_key", "k\n"), ("polar_connect_timeout", "ten"),
    ("polar_first_byte_timeout", "0"), ("polar_idle_timeout", "-1"), ("polar_max_body_mb", "nan"),
    ("polar_rotate_mb", "inf"), ("polar_min_free_mb", "-1"), ("polar_logprobs_mode", "raw"),
    ("polar_thinking_kwarg", "enable thinking"), ("polar_sampling_override", "max_tokens=5"),
    ("polar_exact", "yes"), ("polar_exact_cache_mb", "0"), ("polar_control_token", ""),
    ("polar_control_token", " /tmp/t"), ("polar_control_token", "/tmp/a\nb"), ("polar_hold_timeout", "0"),
    ("polar_hold_timeout", "soon"), ("polar_hold_timeout", "inf"),
])
def test_1_2_a_bad_value_is_one_line_naming_the_option_and_what_it_expects(name, value):
    with pytest.raises(OptionError) as err:
        parse_options({**DEFAULTS, name: value})
    line = str(err.value)
    assert err.value.name == name and line.startswith(f"{name}: expected ") and "\n" not in line
    assert repr(value)[:20] in line or str(value)[:20] in line


def test_1_3_edge_values_that_are_fine():
    o = parse_options({**DEFAULTS, "polar_min_free_mb": "0", "polar_hosts": ["API.Anthropic.com.", "[::1]:8443"],
                       "polar_upstream": "https://h.example/v1/", "polar_thinking_kwarg": "enable_thinking"})
    assert o.min_free_mb == 0 and ("api.anthropic.com", 443) in o.hosts and ("::1", 8443) in o.hosts


def test_1_4_the_control_options():
    o = parse_options(DEFAULTS)
    assert o.control_token is None and o.hold_timeout == 120.0  # None: <confdir>/control-token
    o = parse_options({**DEFAULTS, "polar_control_token": "/run/polar/token", "polar_hold_timeout": "2.5"})
    assert o.control_token == "/run/polar/token" and o.hold_timeout == 2.5


def test_2_1_sampling_override():
    assert parse_sampling_override("temperature=1.6, top_p=1.0,top_k=20") == {"temperature": 1.6, "top_p": 1.0,
                                                                              "top_k": 20}
    assert parse_sampling_override(None) == {} and parse_sampling_override(" , ") == {}
    for bad in ("n=2", "temperature", "temperature=hot", "top_k=1.5", "temperature=nan"):
        with pytest.raises(OptionError, match="polar_sampling_override"):
            parse_sampling_override(bad)


def _manager(*specs: str) -> optmanager.OptManager:
    m = optmanager.OptManager()
    m.set(*specs, defer=True)  # as mitmdump does with --set before the script declares its options
    for o in OPTIONS:
        m.add_option(o.name, o.typespec, o.default, o.help)
    return m


def test_3_1_values_mitmproxys_parser_rejects_are_taken_out_with_our_line():
    m = _manager("polar_exact=yes", "polar_backend=vllm", "polar_model=a", "polar_model=b")
    errors = take_unparseable(m, {o.name for o in OPTIONS})
    assert set(errors) == {"polar_exact", "polar_model"}
    assert str(errors["polar_exact"]).startswith("polar_exact: expected true or false")
    assert "more than once" in str(errors["polar_model"])
    m.process_deferred()  # what mitmproxy does next: no longer raises, and the good value still applies
    assert m.polar_backend == "vllm" and m.polar_exact is False


def test_3_2_without_taking_them_mitmproxy_raises_at_registration():
    m = _manager("polar_exact=yes")
    with pytest.raises(Exception):
        m.process_deferred()


def test_3_3_an_unknown_deferred_shape_counts_as_unparseable():
    class Odd:
        deferred = {"polar_exact": type("U", (), {"val": ["true"]})()}

    assert "polar_exact" in take_unparseable(Odd(), {"polar_exact"})  # no _parse_setval: fail closed
