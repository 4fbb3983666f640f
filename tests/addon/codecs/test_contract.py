"""The codec seam (`codecs.base.Codec`): every module in `codecs.ROUTERS` provides every member, of the right kind,
callable the way the driver calls it; every Encoder builds a `ResponseEncoder`; every module keeps the one section
order; and the wire helpers the codecs share (`codecs.wire`) — no sockets.

Scenarios: 1.x the module satisfies Codec · 2.x its Encoder satisfies ResponseEncoder · 3.x one section order ·
4.x the wire helpers.
"""

from __future__ import annotations

import inspect
import re
import typing

import orjson
import pytest

from polar import records as record
from polar.addon.codecs import ROUTERS, find_route
from polar.addon.codecs.base import (
    AgentInputError,
    ChatPlan,
    Codec,
    Completion,
    Delta,
    EncodeContext,
    GatewayError,
    ResponseEncoder,
    Route,
)
from polar.addon.codecs.wire import Notes, header, host_name, is_int, is_number, number_between, openai_error, sse

pytestmark = pytest.mark.unit

CODECS = pytest.mark.parametrize("codec", ROUTERS, ids=lambda c: c.PROTOCOL)


def _members(protocol: type) -> tuple[dict[str, typing.Any], dict[str, inspect.Signature]]:
    """(data members with their annotation, methods with their signature less `self`) a Protocol declares."""
    hints = typing.get_type_hints(protocol)
    methods = {name: inspect.signature(fn) for name, fn in vars(protocol).items()
               if inspect.isfunction(fn) and not name.startswith("_")}
    for name, sig in methods.items():
        methods[name] = sig.replace(parameters=list(sig.parameters.values())[1:])
    return hints, methods


def _accepts(impl, declared: inspect.Signature) -> str | None:
    """Why `impl` cannot be called as `declared` says (same positional names in order; a parameter the protocol
    defaults is defaulted; any extra one is optional), or None when it can."""
    got = list(inspect.signature(impl).parameters.values())
    want = list(declared.parameters.values())
    if len(got) < len(want):
        return f"takes {len(got)} parameters, the protocol passes {len(want)}"
    for g, w in zip(got, want):
        if g.name != w.name or g.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
            return f"parameter {g.name!r} where the protocol has {w.name!r}"
        if w.default is not inspect.Parameter.empty and g.default is inspect.Parameter.empty:
            return f"parameter {g.name!r} needs the protocol's default"
    for g in got[len(want):]:
        if g.default is inspect.Parameter.empty and g.kind not in (g.VAR_POSITIONAL, g.VAR_KEYWORD):
            return f"extra parameter {g.name!r} has no default"
    return None


def _context(codec) -> EncodeContext:
    route = Route(codec.PROTOCOL, "generate", stream=True)
    plan = ChatPlan(chat={"messages": [{"role": "user", "content": "hi"}]}, stream=True, model_requested="m")
    return EncodeContext(plan, route, "r1", model="m", prompt_tokens=3, created=1)


# ------------------------------------------------------------------------------------------- 1.x the Codec seam

@CODECS
def test_1_1_every_codec_module_satisfies_the_protocol(codec):
    assert isinstance(codec, Codec)


@CODECS
def test_1_2_data_members_are_strings_and_the_encoder_a_class(codec):
    hints, _ = _members(Codec)
    for name in hints:
        value = getattr(codec, name)
        if name == "Encoder":
            assert inspect.isclass(value), f"{codec.__name__}.Encoder is not a class"
        else:
            assert isinstance(value, str) and value, f"{codec.__name__}.{name} is not a non-empty string"
    assert codec.PROTOCOL in record.PROTOCOLS


@CODECS
def test_1_3_every_function_can_be_called_as_the_protocol_declares(codec):
    _, methods = _members(Codec)
    for name, declared in methods.items():
        impl = getattr(codec, name)
        assert inspect.isfunction(impl), f"{codec.__name__}.{name} is not a function"
        assert _accepts(impl, declared) is None, f"{codec.__name__}.{name}: {_accepts(impl, declared)}"


def test_1_4_one_module_per_recorded_protocol():
    protocols = [c.PROTOCOL for c in ROUTERS]
    assert len(set(protocols)) == len(protocols) and set(protocols) == set(record.PROTOCOLS)


@CODECS
def test_1_5_the_members_answer_in_their_declared_types(codec):
    route = Route(codec.PROTOCOL, "generate", stream=True)
    done = Completion(content="ok", reasoning="", tool_calls=(), finish_reason="stop", stop_reason=None,
                      prompt_tokens=3, completion_tokens=1)
    assert isinstance(codec.stream_content_type(route), str)
    assert isinstance(codec.provider_stop_reason(done, _context(codec).plan), str)
    status, body = codec.error_response(GatewayError("unavailable", "down"))
    assert isinstance(status, int) and isinstance(orjson.loads(body), dict)
    assert isinstance(codec.count_tokens_response(7, route), dict)
    assert codec.session_key([], {}) is None


# ------------------------------------------------------------------------------------- 2.x the Encoder it builds

@CODECS
def test_2_1_the_encoder_satisfies_response_encoder_with_notes_a_list(codec):
    enc = codec.Encoder(_context(codec))
    assert isinstance(enc, ResponseEncoder)
    assert isinstance(enc.notes, list)


@CODECS
def test_2_2_encoder_methods_take_what_the_driver_passes(codec):
    _, methods = _members(ResponseEncoder)
    enc = codec.Encoder(_context(codec))
    for name, declared in methods.items():
        bound = getattr(enc, name)
        assert inspect.ismethod(bound), f"{codec.__name__}.Encoder.{name} is not a method"
        assert _accepts(bound, declared) is None, f"{codec.__name__}.Encoder.{name}: {_accepts(bound, declared)}"


@CODECS
def test_2_3_a_whole_stream_is_bytes_and_the_body_a_dict(codec):
    enc = codec.Encoder(_context(codec))
    done = Completion(content="hi", reasoning="", tool_calls=(), finish_reason="stop", stop_reason=None,
                      prompt_tokens=3, completion_tokens=1)
    events = enc.start() + enc.delta(Delta(text="hi")) + enc.finish(done)
    assert events and all(isinstance(e, bytes) for e in events)
    assert isinstance(codec.Encoder(_context(codec)).response(done), dict)
    assert all(isinstance(e, bytes) for e in codec.Encoder(_context(codec)).error(GatewayError("unavailable", "x")))


# ----------------------------------------------------------------------------------------- 3.x one section order

SECTIONS = ("constants", "route and session key", "request:", "response:", "errors and token counts")
_HEADER = re.compile(r"^# -{100,}\n# (.+)\n# -{100,}$", re.MULTILINE)


@CODECS
def test_3_1_every_codec_module_keeps_the_one_section_order(codec):
    titles = _HEADER.findall(inspect.getsource(codec))
    assert len(titles) == len(SECTIONS), titles
    for title, want in zip(titles, SECTIONS):
        assert title.startswith(want), (title, want)


@CODECS
def test_3_2_the_module_docstring_states_the_order(codec):
    assert "constants · route and session key · request (to_chat) ·" in " ".join(codec.__doc__.split())


# ----------------------------------------------------------------------------------------------- 4.x wire helpers

@pytest.mark.parametrize("headers", [
    {"X-Session": "s1"},
    [("x-session", "s1")],
    [(b"X-SESSION", b"s1")],
    (("Other", "o"), ("X-Session", "s1")),
])
def test_4_1_header_lookup_is_case_insensitive_in_every_shape(headers):
    assert header(headers, "x-session") == "s1"
    assert header(headers, "X-Session") == "s1"
    assert header(headers, "missing") is None


def test_4_2_header_lookup_with_no_headers_is_none():
    assert header(None, "a") is None and header([], "a") is None and header({}, "a") is None


@pytest.mark.parametrize("raw,name", [
    ("api.openai.com", "api.openai.com"),
    ("API.OpenAI.com:443", "api.openai.com"),
    ("api.anthropic.com:8443", "api.anthropic.com"),
    ("chatgpt.com.", "chatgpt.com"),
    (" generativelanguage.googleapis.com ", "generativelanguage.googleapis.com"),
    ("[::1]:443", "[::1]:443"),
    (None, ""),
])
def test_4_3_host_name_is_the_one_rule(raw, name):
    assert host_name(raw) == name


@pytest.mark.parametrize("host", ["api.anthropic.com", "api.openai.com", "chatgpt.com",
                                  "generativelanguage.googleapis.com", "dashscope.aliyuncs.com"])
def test_4_4_every_codec_routes_its_host_with_any_case_and_port(host):
    path = {"api.anthropic.com": "/v1/messages", "chatgpt.com": "/backend-api/codex/responses",
            "generativelanguage.googleapis.com": "/v1beta/models/m:generateContent",
            "dashscope.aliyuncs.com": "/compatible-mode/v1/chat/completions"}.get(host, "/v1/chat/completions")
    plain = find_route("POST", host, path, [])
    assert plain is not None
    for variant in (host.upper(), f"{host}:443", f"{host}:8443", f"{host}."):
        found = find_route("POST", variant, path, [])
        assert found is not None and found[0] is plain[0] and found[1] == plain[1], variant


def test_4_5_number_checks():
    assert is_number(1) and is_number(0.5) and not is_number(True) and not is_number(float("inf"))
    assert not is_number("1") and is_int(3) and not is_int(False) and not is_int(1.0)
    assert number_between({"t": 0.5}, "t", 0.0, 1.0) == 0.5
    assert number_between({"t": None}, "t", 0.0, 1.0) is None and number_between({}, "t", 0.0, 1.0) is None
    for bad in (1.5, "0.5", True, float("nan")):
        with pytest.raises(AgentInputError, match="'t' must be a number between 0.0 and 1.0"):
            number_between({"t": bad}, "t", 0.0, 1.0)


def test_4_6_notes_keep_first_order_without_duplicates():
    notes = Notes()
    for n in ("b", "a", "b", "c", "a"):
        notes.add(n)
    assert notes.items == ("b", "a", "c")


def test_4_7_sse_frames_with_and_without_an_event_name():
    assert sse("ping", b"{}") == b"event: ping\ndata: {}\n\n"
    assert sse(None, "{}") == b"data: {}\n\n"


def test_4_8_openai_error_object_names_the_prompt_field_on_overflow_only():
    status, obj = openai_error(GatewayError("context_overflow", "too long"), "input")
    assert status == 400 and obj == {"message": "too long", "type": "invalid_request_error", "param": "input",
                                     "code": "context_length_exceeded"}
    status, obj = openai_error(GatewayError("unavailable", "down"), "messages")
    assert status == 503 and obj["param"] is None and obj["code"] == "service_unavailable"
    assert openai_error(GatewayError("bad_request", "no", status=422), "messages")[0] == 422
